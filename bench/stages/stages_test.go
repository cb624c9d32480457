// Package stages_test runs each stage of `cairn put` alone on the same data
// in the same process, and the whole put, so that the bound each stage sets
// and the put's overhead over the slowest one read from one table
// (issue 19, "Know where the time goes"). bench/stages.sh runs it, writes
// CPU profiles of the whole puts and prints the table.
//
// Two data sets: "small", 10,000 files of 4 KiB (100 directories of 100,
// random content), and "large", one incompressible file of
// CAIRN_BENCH_LARGE_MIB MiB (default 256; 2048 by hand). Every stage runs
// over the whole set once per iteration, so -benchtime=1x is one pass.
//
// Stages (BenchmarkStages/SET/STAGE), each over the output of the one
// before it, computed untimed first:
//
//	read     open, read and close each source file (page-cached)
//	chunk    FastCDC (internal/chunker's Cutter, the volume's gear seed)
//	key      keyed BLAKE3 of each chunk: the convergent chunk key
//	compress the compression decision (a 2 KiB zstd sample of chunks of
//	         8 KiB and more; a full zstd pass below that, from 64 bytes) and
//	         zstd where the decision says so
//	seal     the synthetic nonce and AES-256-GCM of the inner message
//	hash     BLAKE3-256 of the stored bytes: the chunk ID
//	store    localstore Put of every stored chunk into a fresh store, as a
//	         realm opens it (TrustIDs, fsync on)
//	meta     the metadata commit of each file on an embedded etcd with
//	         fsync on (in this process), as fs.WriteFile does it: Lock, Get
//	         of the name, CommitVersion, Unlock (WriteGen once per pass, as
//	         fs caches it)
//
// key, compress, seal and hash mirror internal/pipeline/chunk.go's
// encodeChunk step by step with the same primitives (those steps are not
// exported); the benchmark fails if their result differs from
// pipeline.EncodeChunk's. (EncodeChunk itself is not timed: it builds a
// keyed hasher per call, which the engine does not.)
//
// Parallelism is what the put gives each stage: the CPU stages run on
// GOMAXPROCS goroutines (the engine's workers), except chunking the large
// file (one stream, one chunker); read, store and meta of the small set run
// on 32×GOMAXPROCS goroutines (put's file workers), the large file's store
// Puts on 256 (the Puts fs lets one file's write keep in flight).
//
// BenchmarkPut/SET is the whole `cairn put --json SRC home:/` through
// cli.Main in this process, into a realm made by `cairn init
// --no-passphrase` (untimed); its embedded etcd runs in a daemon process,
// as it does for the command (this test binary serves as the daemon).
// CAIRN_BENCH_PUT_CPUPROFILE=FILE has the command write its CPU profile
// there (cairn's hidden --cpuprofile flag).
//
// Metrics: MB/s (10^6 bytes of file data per second), files/s, and
// MB/cpu-s (file data per CPU-second of this process, all threads: it does
// not depend on other load; the etcd daemon's CPU is not in it).
package stages_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/chunker"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/store/localstore"
)

// workDir holds the generated data sets, stores and realms: on disk
// (BENCH_TMP, default /var/tmp), as bench/lib.sh's harnesses use.
var workDir string

func TestMain(m *testing.M) {
	// `cairn init` and `cairn put` start the realm's etcd daemon by
	// running this binary again.
	etcdsvc.RunDaemonIfRequested()
	base := os.Getenv("BENCH_TMP")
	if base == "" {
		base = "/var/tmp"
	}
	var err error
	if workDir, err = os.MkdirTemp(base, "cairn-stages."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(workDir)
	os.Exit(code)
}

// A dataset is a set of files on disk and in memory.
type dataset struct {
	name  string
	dir   string   // the files, below dir/src
	paths []string // each file's path
	data  [][]byte // each file's content
	bytes int64
	// chunks are each file's chunks as the chunker cuts them; chunkFile
	// the file each belongs to.
	chunks    [][]byte
	chunkFile []int
}

// seq names what each pass creates afresh (stores, directories, realms):
// benchmarks run again under -count, and every pass must start empty.
var seq atomic.Int64

var (
	setsMu sync.Mutex
	sets   = map[string]*dataset{}
)

func largeMiB() int {
	if s := os.Getenv("CAIRN_BENCH_LARGE_MIB"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return 256
}

// getSet generates (once per process) the named data set.
func getSet(b *testing.B, name string) *dataset {
	b.Helper()
	setsMu.Lock()
	defer setsMu.Unlock()
	if ds := sets[name]; ds != nil {
		return ds
	}
	ds := &dataset{name: name, dir: filepath.Join(workDir, "set-"+name)}
	rng := rand.NewChaCha8([32]byte{'c', 'a', 'i', 'r', 'n', byte(len(name))})
	add := func(rel string, size int) {
		p := filepath.Join(ds.dir, "src", rel)
		buf := make([]byte, size)
		rng.Read(buf)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf, 0o644); err != nil {
			b.Fatal(err)
		}
		ds.paths, ds.data = append(ds.paths, p), append(ds.data, buf)
		ds.bytes += int64(size)
	}
	switch name {
	case "small":
		for d := range 100 {
			for f := range 100 {
				add(fmt.Sprintf("d%02d/f%03d", d, f), 4<<10)
			}
		}
	case "large":
		add("large.bin", largeMiB()<<20)
	default:
		b.Fatalf("no data set %q", name)
	}
	cut := newCutter(b)
	for i, d := range ds.data {
		for len(d) > 0 {
			n := cut.Cut(d)
			ds.chunks, ds.chunkFile = append(ds.chunks, d[:n:n]), append(ds.chunkFile, i)
			d = d[n:]
		}
	}
	sets[name] = ds
	return ds
}

var (
	conv = [32]byte{1, 2, 3}
	gear = [32]byte{4, 5, 6}
)

func newCutter(b *testing.B) *chunker.Cutter {
	c, err := chunker.NewCutter(gear, chunker.DefaultParams())
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// parallel runs fn(i) for i in [0, n) on the given number of goroutines.
func parallel(workers, n int, fn func(i int) error) error {
	var next atomic.Int64
	var first error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// cpuTime is this process's CPU time, all threads.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measure runs one pass of a stage per iteration (setup untimed) and
// reports MB/s of file data, files/s and MB/cpu-s.
func measure(b *testing.B, ds *dataset, setup func(), pass func() error) {
	b.SetBytes(ds.bytes)
	b.ReportAllocs()
	var cpu time.Duration
	iter := 0
	b.ResetTimer()
	for b.Loop() {
		if setup != nil {
			b.StopTimer()
			setup()
			b.StartTimer()
		}
		c0 := cpuTime()
		if err := pass(); err != nil {
			b.Fatal(err)
		}
		cpu += cpuTime() - c0
		iter++
	}
	el := b.Elapsed().Seconds()
	if el > 0 {
		b.ReportMetric(float64(iter*len(ds.data))/el, "files/s")
	}
	if cpu > 0 {
		b.ReportMetric(float64(int64(iter)*ds.bytes)/1e6/cpu.Seconds(), "MB/cpu-s")
	}
}

// The compressor as internal/pipeline configures it.
var zenc = sync.OnceValue(func() *zstd.Encoder {
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderCRC(false), zstd.WithLowerEncoderMem(true))
	if err != nil {
		panic(err)
	}
	return e
})

// Constants of internal/pipeline/chunk.go.
const (
	hdrSize     = 13
	sampleAbove = 8 << 10
	sampleSize  = 2 << 10
	minCompress = 64
)

// compress is pipeline's compression decision and zstd pass: the inner
// message (flag byte and payload) after a header's room, in dst.
func compress(plain, dst []byte) (stored []byte, compressed bool) {
	stored = append(dst[:0], make([]byte, hdrSize+1)...)
	stored[hdrSize] = 1
	should := len(plain) >= minCompress
	if should && len(plain) >= sampleAbove {
		mid := len(plain)/2 - sampleSize/2
		z := zenc().EncodeAll(plain[mid:mid+sampleSize], stored[hdrSize+1:hdrSize+1])
		should = len(z) <= sampleSize-sampleSize/32
	}
	if should {
		z := zenc().EncodeAll(plain, stored)
		if len(z)-hdrSize-1 < len(plain) {
			return z, true
		}
	}
	stored[hdrSize] = 0
	return append(stored[:hdrSize+1], plain...), false
}

var (
	nonceKDF    = blake3.NewDeriveKey("cairn v1 chunk nonce key")
	rawNonceKDF = blake3.NewDeriveKey("cairn v1 raw chunk nonce")
)

// seal is pipeline's seal: the synthetic nonce and AES-256-GCM in place.
func seal(key *[32]byte, stored []byte) []byte {
	inner := stored[hdrSize:]
	var sum [32]byte
	if inner[0] == 0 {
		d := rawNonceKDF.Clone()
		d.Write(key[:])
		d.Sum(sum[:0])
	} else {
		var kn [32]byte
		d := nonceKDF.Clone()
		d.Write(key[:])
		d.Sum(kn[:0])
		h, _ := blake3.NewKeyed(kn[:])
		h.Write(inner)
		h.Sum(sum[:0])
	}
	stored[0] = pipeline.ChunkVersion
	copy(stored[1:hdrSize], sum[:])
	block, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	ct := aead.Seal(stored[hdrSize:hdrSize], stored[1:hdrSize], inner, stored[:hdrSize])
	return stored[:hdrSize+len(ct)]
}

// cpuWorkers is how many goroutines a CPU stage gets.
func cpuWorkers() int { return runtime.GOMAXPROCS(0) }

// fsPutConcurrency is the Puts one file's write keeps in flight
// (fs.Options.PutConcurrency's default, which fs gives the engine).
const fsPutConcurrency = 256

// ioWorkers is put's number of file workers.
func ioWorkers() int { return 32 * runtime.GOMAXPROCS(0) }

func BenchmarkStages(b *testing.B) {
	for _, name := range []string{"small", "large"} {
		b.Run(name, func(b *testing.B) { benchStages(b, name) })
	}
}

func benchStages(b *testing.B, name string) {
	ds := getSet(b, name)
	nc := len(ds.chunks)
	keyed := sync.Pool{New: func() any { h, _ := blake3.NewKeyed(conv[:]); return h }}
	keys := make([][32]byte, nc)
	key := func(i int) error {
		h := keyed.Get().(*blake3.Hasher)
		h.Reset()
		h.Write(ds.chunks[i])
		h.Sum(keys[i][:0])
		keyed.Put(h)
		return nil
	}
	// Buffers for the encoded chunks, reused across stages.
	bufs := make([][]byte, nc)
	for i, c := range ds.chunks {
		bufs[i] = make([]byte, 0, len(c)+pipeline.Overhead+64)
	}
	inner := make([][]byte, nc)
	doCompress := func(i int) error {
		inner[i], _ = compress(ds.chunks[i], bufs[i])
		return nil
	}
	stored := make([][]byte, nc)
	ids := make([]cairn.ID, nc)

	b.Run("read", func(b *testing.B) {
		// Reads of up to 1 MiB into a reused buffer, as the chunker reads.
		w := 1
		if len(ds.data) > 1 {
			w = ioWorkers()
		}
		bufs := sync.Pool{New: func() any { return make([]byte, 1<<20) }}
		measure(b, ds, nil, func() error {
			return parallel(w, len(ds.paths), func(i int) error {
				f, err := os.Open(ds.paths[i])
				if err != nil {
					return err
				}
				defer f.Close()
				buf := bufs.Get().([]byte)
				defer bufs.Put(buf)
				var n int64
				for {
					k, err := f.Read(buf)
					n += int64(k)
					if err == io.EOF {
						break
					} else if err != nil {
						return err
					}
				}
				if n != int64(len(ds.data[i])) {
					return fmt.Errorf("read %d bytes of %s, want %d", n, ds.paths[i], len(ds.data[i]))
				}
				return nil
			})
		})
	})
	b.Run("chunk", func(b *testing.B) {
		cut := newCutter(b)
		measure(b, ds, nil, func() error {
			return parallel(cpuWorkers(), len(ds.data), func(i int) error {
				for d := ds.data[i]; len(d) > 0; {
					d = d[cut.Cut(d):]
				}
				return nil
			})
		})
	})
	b.Run("key", func(b *testing.B) {
		measure(b, ds, nil, func() error { return parallel(cpuWorkers(), nc, key) })
	})
	_ = parallel(cpuWorkers(), nc, key)
	b.Run("compress", func(b *testing.B) {
		measure(b, ds, nil, func() error { return parallel(cpuWorkers(), nc, doCompress) })
	})
	// seal works in place: each pass starts from a fresh inner message.
	sealSetup := func() { _ = parallel(cpuWorkers(), nc, doCompress) }
	b.Run("seal", func(b *testing.B) {
		measure(b, ds, sealSetup, func() error {
			return parallel(cpuWorkers(), nc, func(i int) error {
				stored[i] = seal(&keys[i], inner[i])
				return nil
			})
		})
	})
	// The stored chunks and their IDs, afresh whatever stages ran (-bench
	// may pick some): the hash stage's input, the store's, and the check.
	sealSetup()
	_ = parallel(cpuWorkers(), nc, func(i int) error { stored[i] = seal(&keys[i], inner[i]); return nil })
	_ = parallel(cpuWorkers(), nc, func(i int) error { ids[i] = blake3.Sum256(stored[i]); return nil })
	// The stages must add up to the real encoding.
	if ref, real := pipeline.EncodeChunk(conv, ds.chunks[0]); ref.ID != ids[0] || !bytes.Equal(real, stored[0]) {
		b.Fatalf("the stages do not reproduce pipeline.EncodeChunk (id %s, want %s)", ids[0].Short(), ref.ID.Short())
	}
	b.Run("hash", func(b *testing.B) {
		measure(b, ds, nil, func() error {
			return parallel(cpuWorkers(), nc, func(i int) error { ids[i] = blake3.Sum256(stored[i]); return nil })
		})
	})
	b.Run("store", func(b *testing.B) {
		ctx := context.Background()
		var st *localstore.Store
		w := fsPutConcurrency
		if len(ds.data) > 1 {
			w = ioWorkers()
		}
		measure(b, ds, func() {
			if st != nil {
				st.Close()
			}
			var err error
			dir := filepath.Join(ds.dir, fmt.Sprintf("store-%d", seq.Add(1)))
			if st, err = localstore.Open(ctx, dir, localstore.Options{TrustIDs: true}); err != nil {
				b.Fatal(err)
			}
		}, func() error {
			return parallel(w, nc, func(i int) error { return st.Put(ctx, ids[i], stored[i]) })
		})
		st.Close()
	})
	b.Run("meta", func(b *testing.B) { benchMeta(b, ds) })
}

// benchMeta commits one version per file, as fs.WriteFile does after the
// data is stored.
func benchMeta(b *testing.B, ds *dataset) {
	ctx := context.Background()
	srv, err := etcdsvc.StartEmbedded(ctx, filepath.Join(ds.dir, fmt.Sprintf("etcd-%d", seq.Add(1))), etcdsvc.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ec, err := etcdtest.NewClient(srv.Endpoint())
	if err != nil {
		b.Fatal(err)
	}
	defer ec.Close()
	svc, err := meta.New(ec, meta.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	if err := svc.InitRealm(ctx, meta.RealmInfo{ID: "bench", Format: 1}); err != nil {
		b.Fatal(err)
	}
	if err := svc.CreateVolume(ctx, meta.Volume{Name: "home", KeepVersions: 10, TrashTTL: time.Hour}, 0o755, 0, 0); err != nil {
		b.Fatal(err)
	}
	v, err := svc.Open(ctx, "home")
	if err != nil {
		b.Fatal(err)
	}
	// Each pass commits into directories of its own (put makes them as it
	// walks, before the files; untimed here).
	dirOf := make([]*meta.Entry, len(ds.paths))
	src := filepath.Join(ds.dir, "src")
	w := 1
	if len(ds.data) > 1 {
		w = ioWorkers()
	}
	measure(b, ds, func() {
		pass := seq.Add(1)
		made := map[string]*meta.Entry{}
		for i, p := range ds.paths {
			rel, _ := filepath.Rel(src, filepath.Dir(p))
			if made[rel] == nil {
				parts := []string{fmt.Sprintf("pass%d", pass)}
				if rel != "." {
					parts = append(parts, rel)
				}
				if made[rel], err = v.MkdirAll(ctx, parts, 0o755, 0, 0); err != nil {
					b.Fatal(err)
				}
			}
			dirOf[i] = made[rel]
		}
	}, func() error {
		// fs reads the GC generation once and keeps it (fs.Volume.writeGen).
		gen, err := svc.WriteGen(ctx)
		if err != nil {
			return err
		}
		return parallel(w, len(ds.paths), func(i int) error {
			dir, name := dirOf[i], filepath.Base(ds.paths[i])
			lock, err := v.Lock(ctx, dir.Ino, name)
			if err != nil {
				return err
			}
			defer lock.Unlock(ctx)
			cur, err := v.Get(ctx, dir.Ino, name)
			if err != nil && !errors.Is(err, cairn.ErrNotFound) {
				return err
			}
			var mid cairn.ID
			binaryID(&mid, i)
			size := int64(len(ds.data[i]))
			ver := meta.Version{Manifest: mid, Size: size, Mtime: time.Now().UnixNano(), Stores: []string{"local"},
				Chunks: max(1, int(size>>14)), Src: meta.Source{Dev: 1, Ino: uint64(i + 1), Size: size, Mtime: 1},
				Digest: fmt.Sprintf("%064x", i)}
			_, _, err = v.CommitVersion(ctx, dir, name, meta.Commit{Version: ver, Mode: 0o644, Gen: gen, Lock: lock, Cur: meta.KnownEntry(cur)})
			return err
		})
	})
}

func binaryID(id *cairn.ID, i int) {
	h := blake3.Sum256([]byte(strconv.Itoa(i)))
	copy(id[:], h[:])
}

// BenchmarkPut is the whole `cairn put --json SRC home:/` into a fresh
// realm, through cli.Main.
func BenchmarkPut(b *testing.B) {
	for _, name := range []string{"small", "large"} {
		b.Run(name, func(b *testing.B) { benchPut(b, name) })
	}
}

func benchPut(b *testing.B, name string) {
	ds := getSet(b, name)
	b.Setenv("CAIRN_NO_AUTODRAIN", "1")
	var realm string
	stop := func() {
		if realm != "" {
			stopDaemon(b, realm)
			os.RemoveAll(realm)
		}
	}
	defer stop()
	measure(b, ds, func() {
		stop()
		realm = filepath.Join(ds.dir, fmt.Sprintf("realm-%d", seq.Add(1)))
		b.Setenv("CAIRN_HOME", realm)
		if out, code := runCLI(b, "init", "--no-passphrase"); code != 0 {
			b.Fatalf("cairn init: exit %d: %s", code, out)
		}
	}, func() error {
		args := []string{"put", "--json", filepath.Join(ds.dir, "src"), "home:/"}
		if prof := os.Getenv("CAIRN_BENCH_PUT_CPUPROFILE"); prof != "" {
			// The command's own CPU profile: the put alone, not the
			// data set's generation nor the realm's init.
			args = append([]string{"--cpuprofile", prof}, args...)
		}
		out, code := runCLI(b, args...)
		if code != 0 {
			return fmt.Errorf("cairn put: exit %d: %s", code, out)
		}
		var sum cli.PutSummary
		if err := json.Unmarshal(out, &sum); err != nil {
			return fmt.Errorf("cairn put --json: %v: %s", err, out)
		}
		if sum.Files != int64(len(ds.data)) || sum.Bytes != ds.bytes {
			return fmt.Errorf("cairn put stored %d files of %d bytes, want %d of %d", sum.Files, sum.Bytes, len(ds.data), ds.bytes)
		}
		return nil
	})
}

// runCLI runs cli.Main with its stdout (and stdin) redirected.
func runCLI(b *testing.B, args ...string) ([]byte, int) {
	b.Helper()
	out, err := os.CreateTemp(workDir, "stdout")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	oldOut, oldIn := os.Stdout, os.Stdin
	os.Stdout, os.Stdin = out, null
	code := cli.Main(args)
	os.Stdout, os.Stdin = oldOut, oldIn
	data, err := os.ReadFile(out.Name())
	if err != nil {
		b.Fatal(err)
	}
	return data, code
}

// stopDaemon ends the realm's etcd daemon (its pid is the endpoint file's
// third field, as bench/lib.sh reads it) and waits for it to exit.
func stopDaemon(b *testing.B, realm string) {
	data, err := os.ReadFile(filepath.Join(realm, "etcd", "endpoint"))
	if err != nil {
		return
	}
	f := bytes.Fields(data)
	if len(f) < 3 {
		return
	}
	pid, err := strconv.Atoi(string(f[2]))
	if err != nil || pid <= 0 {
		return
	}
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		// A zombie (not reaped: the daemon is not our child) counts as gone.
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || bytes.Contains(st, []byte(") Z ")) {
			return
		}
	}
	b.Logf("etcd daemon %d of %s still running after 30 s", pid, realm)
}
