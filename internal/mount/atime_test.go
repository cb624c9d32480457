package mount_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/mount"
)

// TestReadsWriteNothing checks what doc/posix.md ("atime") says: reads,
// listings, stats, readlinks and execs on the mount write nothing to etcd
// in any mode (no atime update, batched or not), atime reads as mtime,
// and an atime set alone (touch -a) is accepted but not kept, and writes
// nothing either.
func TestReadsWriteNothing(t *testing.T) {
	for _, mode := range []mount.Mode{mount.Blocking, mount.NonBlocking, mount.WriteBack} {
		t.Run(mode.String(), func(t *testing.T) {
			f := newFixture(t, mount.Options{Mode: mode})
			content := randBytes(100 << 10)
			if err := os.Mkdir(f.path("d"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f.path("d/a"), content, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f.path("d/run.sh"), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("a", f.path("d/l")); err != nil {
				t.Fatal(err)
			}
			// The unmount waits for queued commits and writes pending
			// namespace changes: after it, the setup is all in etcd.
			f.mountAgain(mount.Options{Mode: mode})
			if e := f.entry("d/a"); e.Current() == nil || e.Current().Size != int64(len(content)) {
				t.Fatalf("d/a in the metadata after the setup: %+v", e)
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: f.etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			rev := func() int64 {
				t.Helper()
				r, gerr := cli.Get(context.Background(), "\x00")
				if gerr != nil {
					t.Fatal(gerr)
				}
				return r.Header.Revision
			}
			before := rev()
			f.waitWatched(before)

			st0 := statx(t, f.path("d/a"))
			for i := 0; i < 20; i++ {
				if got, rerr := os.ReadFile(f.path("d/a")); rerr != nil || !bytes.Equal(got, content) {
					t.Fatalf("read %d: %v (%d bytes)", i, rerr, len(got))
				}
				if ents, rerr := os.ReadDir(f.path("d")); rerr != nil || len(ents) != 3 {
					t.Fatalf("listing %d: %v (%d entries)", i, rerr, len(ents))
				} else {
					for _, e := range ents {
						if _, ierr := e.Info(); ierr != nil {
							t.Fatal(ierr)
						}
					}
				}
				for _, p := range []string{"", "d", "d/a", "d/run.sh"} {
					if _, serr := os.Stat(f.path(p)); serr != nil {
						t.Fatal(serr)
					}
				}
				if target, lerr := os.Readlink(f.path("d/l")); lerr != nil || target != "a" {
					t.Fatalf("readlink %d: %q, %v", i, target, lerr)
				}
				// Executed by a shell, not by this process: the execve of a
				// file on the mount by a child of the process that serves
				// it deadlocks whenever a garbage collection starts
				// meanwhile (see run in programs_test.go).
				if out, xerr := exec.Command("/bin/sh", "-c", `"$0"`, f.path("d/run.sh")).CombinedOutput(); xerr != nil {
					t.Fatalf("exec %d: %v: %s", i, xerr, out)
				}
			}
			// atime reads as mtime, before and after reads.
			st := statx(t, f.path("d/a"))
			if st.Atim != st.Mtim || st0.Atim != st0.Mtim || st.Mtim != st0.Mtim {
				t.Fatalf("atime %v, mtime %v after the reads (before: %v, %v); want atime = mtime, unchanged",
					time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()), time.Unix(st0.Atim.Unix()), time.Unix(st0.Mtim.Unix()))
			}
			// An atime set alone succeeds and is not kept.
			set := []unix.Timespec{unix.NsecToTimespec(time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC).UnixNano()), {Nsec: unix.UTIME_OMIT}}
			if err = unix.UtimesNanoAt(unix.AT_FDCWD, f.path("d/a"), set, 0); err != nil {
				t.Fatalf("utimensat of atime alone: %v", err)
			}
			if st = statx(t, f.path("d/a")); st.Atim != st0.Mtim || st.Mtim != st0.Mtim {
				t.Fatalf("after setting atime alone: atime %v, mtime %v; want both the old mtime %v",
					time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix()), time.Unix(st0.Mtim.Unix()))
			}

			// Anything the mount deferred is written by its unmount.
			f.mountAgain(mount.Options{Mode: mode})
			if after := rev(); after != before {
				t.Fatalf("etcd went from revision %d to %d during reads, listings, stats and execs: %s",
					before, after, changedKeys(t, cli, before, after))
			}
		})
	}
}

func statx(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// changedKeys names the first ten keys written after revision from up to
// to.
func changedKeys(t *testing.T, cli *clientv3.Client, from, to int64) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []string
	for resp := range cli.Watch(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithRev(from+1)) {
		for _, ev := range resp.Events {
			if len(keys) < 10 {
				keys = append(keys, ev.Type.String()+" "+string(ev.Kv.Key))
			}
			if ev.Kv.ModRevision >= to {
				return keys
			}
		}
		if resp.Err() != nil {
			break
		}
	}
	t.Logf("watch ended before revision %d", to)
	return keys
}
