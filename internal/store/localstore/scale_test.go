package localstore

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// The scale test is run by hand:
//
//	CAIRN_SCALE=1 go test -run TestScale -v -timeout 60m ./internal/store/localstore/
//
// It puts CAIRN_SCALE_N (default 10 000 000) objects of 64 bytes with 16
// writers, closes the store, then opens it in a fresh process and reports
// the open time, the resident memory and Has/Get latencies. CAIRN_SCALE_DIR
// keeps the store (default: a temporary directory, removed afterwards).

const scaleChildEnv = "CAIRN_LOCALSTORE_SCALE_CHILD"

func scaleObject(i int) (cairn.ID, []byte) {
	var b [64]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	copy(b[8:], "cairn scale test object, filler to 64 bytes.......")
	return blake3.Sum256(b[:]), b[:]
}

func TestScale(t *testing.T) {
	if os.Getenv(scaleChildEnv) != "" {
		scaleChild(t)
		return
	}
	if os.Getenv("CAIRN_SCALE") == "" {
		t.Skip("set CAIRN_SCALE=1 to put 10 M objects and measure open time, RSS and Has latency (several minutes, ~1.6 GB of disk)")
	}
	n := 10_000_000
	if v, err := strconv.Atoi(os.Getenv("CAIRN_SCALE_N")); err == nil {
		n = v
	}
	dir := os.Getenv("CAIRN_SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	s := open(t, dir, Options{NoSync: true})
	start := time.Now()
	var wg sync.WaitGroup
	const writers = 16
	for w := range writers {
		wg.Go(func() {
			for i := w; i < n; i += writers {
				id, data := scaleObject(i)
				if err := s.Put(context.Background(), id, data); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	ingest := time.Since(start)
	t.Logf("put %d objects of 64 B in %v: %.0f puts/s", n, ingest.Round(time.Millisecond), float64(n)/ingest.Seconds())
	t.Logf("ingesting process: %s", memStatus())
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var disk, idx int64
	filepath.Walk(filepath.Join(dir, "packs"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			disk += fi.Size()
			if strings.HasSuffix(p, ".idx") {
				idx += fi.Size()
			}
		}
		return nil
	})
	t.Logf("on disk: %d MB in packs and indexes, of which %d MB indexes", disk>>20, idx>>20)

	for round := range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestScale$", "-test.v")
		cmd.Env = append(os.Environ(), scaleChildEnv+"="+dir, fmt.Sprintf("CAIRN_SCALE_N=%d", n))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); strings.Contains(l, "scale:") {
				t.Logf("fresh process %d: %s", round+1, strings.TrimSpace(l[strings.Index(l, "scale:")+6:]))
			}
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("child: %v", err)
		}
	}
}

func scaleChild(t *testing.T) {
	dir := os.Getenv(scaleChildEnv)
	n, _ := strconv.Atoi(os.Getenv("CAIRN_SCALE_N"))
	start := time.Now()
	s, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("scale: Open %v", time.Since(start).Round(time.Millisecond))
	runtime.GC()
	debug.FreeOSMemory()
	t.Logf("scale: after Open: %s", memStatus())
	u, _ := s.Stats(context.Background())
	if u.Objects != int64(n) {
		t.Fatalf("scale: %d objects, want %d", u.Objects, n)
	}

	const probes = 200_000
	present := make([]cairn.ID, probes)
	absent := make([]cairn.ID, probes)
	for i := range probes {
		present[i], _ = scaleObject((i * 7919) % n)
		absent[i], _ = scaleObject(n + i)
	}
	one := make([]cairn.ID, 1)
	for _, c := range []struct {
		name string
		ids  []cairn.ID
		want bool
	}{{"present", present, true}, {"absent", absent, false}} {
		start2 := time.Now()
		for i := range c.ids {
			one[0] = c.ids[i]
			found, err := s.Has(context.Background(), one)
			if err != nil || found[0] != c.want {
				t.Fatalf("Has %s = %v, %v", c.name, found, err)
			}
		}
		t.Logf("scale: Has of one %s ID: %v", c.name, time.Since(start2)/probes)
		start2 = time.Now()
		for i := 0; i < probes; i += 1000 {
			if _, err := s.Has(context.Background(), c.ids[i:i+1000]); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("scale: Has batch of 1000 %s IDs: %v per batch", c.name, time.Since(start2)/(probes/1000))
	}
	start = time.Now()
	for i := range 20000 {
		if _, err := s.Get(context.Background(), present[i]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("scale: Get of a 64-byte object: %v", time.Since(start)/20000)
	t.Logf("scale: after probes: %s", memStatus())
}

// memStatus reports the process's resident memory from /proc/self/status.
func memStatus() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err.Error()
	}
	var parts []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"VmHWM", "VmRSS", "RssAnon", "RssFile"} {
			if strings.HasPrefix(l, k+":") {
				parts = append(parts, k+" "+strings.Join(strings.Fields(l[len(k)+1:]), " "))
			}
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	parts = append(parts, fmt.Sprintf("GoHeapInuse %d MB", ms.HeapInuse>>20))
	return strings.Join(parts, ", ")
}
