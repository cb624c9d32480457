package localstore

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/storetest"
)

// The crash test re-executes the test binary as a child that writes to a
// store until it is killed with SIGKILL at a random moment. The child reports
// on stdout, one line per write system call, what it has been told is
// durable: "put <id>" after Put returned, "del? <id>" before it starts a
// Delete and "del <id>" after Delete returned. After each kill the parent
// reopens the store and checks every acknowledged operation.

const childEnv = "CAIRN_LOCALSTORE_CRASH_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		crashChild(dir)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

var childOpts = Options{PackSize: 256 << 10, BatchBytes: 256 << 10}

func crashChild(dir string) {
	seed, _ := strconv.ParseUint(os.Getenv(childEnv+"_SEED"), 10, 64)
	s, err := Open(context.Background(), dir, childOpts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child open:", err)
		os.Exit(2)
	}
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // os.Stdout is unbuffered: one write per line
		mu.Unlock()
	}
	var acked []cairn.ID
	var ackMu sync.Mutex
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := uint64(0); ; i++ {
				switch op := r.IntN(100); {
				case op < 40 && w < 4:
					ackMu.Lock()
					if len(acked) == 0 {
						ackMu.Unlock()
						continue
					}
					j := r.IntN(len(acked))
					id := acked[j]
					acked[j] = acked[len(acked)-1]
					acked = acked[:len(acked)-1]
					ackMu.Unlock()
					say("del? %s", id)
					if err := s.Delete(context.Background(), id); err != nil {
						fmt.Fprintln(os.Stderr, "child delete:", err)
						os.Exit(2)
					}
					say("del %s", id)
				case op >= 97 && w == 0:
					freed, err := s.Compact(context.Background())
					if err != nil {
						fmt.Fprintln(os.Stderr, "child compact:", err)
						os.Exit(2)
					}
					say("compacted %d", freed)
				default:
					size := r.IntN(40 << 10)
					if r.IntN(10) == 0 {
						size = r.IntN(300 << 10) // bigger than a pack, sometimes
					}
					id, data := storetest.Blob(seed<<32|uint64(w)<<24|i, size)
					if err := s.Put(context.Background(), id, data); err != nil {
						fmt.Fprintln(os.Stderr, "child put:", err)
						os.Exit(2)
					}
					say("put %s", id)
					ackMu.Lock()
					acked = append(acked, id)
					ackMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

func TestCrash(t *testing.T) {
	iters := 15
	if testing.Short() {
		iters = 4
	}
	if v, err := strconv.Atoi(os.Getenv("CAIRN_CRASH_ITERS")); err == nil {
		iters = v
	}
	dir := t.TempDir()
	type state uint8
	const (
		live    state = iota + 1 // Put acknowledged
		deleted                  // Delete acknowledged
		unknown                  // Delete started, not acknowledged
	)
	objs := map[cairn.ID]state{}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	for it := range iters {
		seed := uint64(it + 1)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+dir, fmt.Sprintf("%s_SEED=%d", childEnv, seed))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan []string)
		go func() {
			var ls []string
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				ls = append(ls, sc.Text())
			}
			lines <- ls
		}()
		time.Sleep(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		ls := <-lines
		if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("child ended by itself: %v", err)
		}
		var puts, dels, compactions int
		for _, l := range ls {
			verb, hex, ok := strings.Cut(l, " ")
			if verb == "compacted" {
				compactions++
				continue
			}
			id, err := cairn.ParseID(hex)
			if !ok || err != nil {
				t.Fatalf("bad child line %q", l)
			}
			switch verb {
			case "put":
				objs[id] = live
				puts++
			case "del?":
				objs[id] = unknown
			case "del":
				objs[id] = deleted
				dels++
			}
		}

		s := open(t, dir, childOpts)
		var nLive int
		for id, st := range objs {
			switch st {
			case live:
				nLive++
				data, err := s.Get(bg, id)
				if err != nil {
					t.Fatalf("iteration %d: acknowledged object %s: %v", it, id.Short(), err)
				}
				if cairn.ID(blake3.Sum256(data)) != id {
					t.Fatalf("iteration %d: %s: wrong content", it, id.Short())
				}
			case deleted:
				mustMissing(t, s, id)
			}
		}
		listed := 0
		s.List(bg, func(id cairn.ID, _ int64) error {
			listed++
			if objs[id] == deleted {
				t.Errorf("iteration %d: List shows deleted %s", it, id.Short())
			}
			return nil
		})
		verifyClean(t, s)
		if listed < nLive {
			t.Fatalf("iteration %d: List shows %d objects, %d acknowledged live", it, listed, nLive)
		}
		// Forget what is settled either way, so later iterations check it.
		for id, st := range objs {
			if st == unknown {
				if found, _ := s.Has(bg, []cairn.ID{id}); found[0] {
					objs[id] = live
				} else {
					objs[id] = deleted
				}
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("iteration %d: killed after %d puts, %d deletes, %d compactions acknowledged; %d live in all", it, puts, dels, compactions, nLive)
	}
	if len(objs) == 0 {
		t.Fatal("the children acknowledged nothing")
	}
}
