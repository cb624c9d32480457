package realm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/pki"
)

// twoDevices makes a realm on device "a" (serving its node until the test
// ends, or until stopA is called) and a second device "b" joined to it;
// both share one etcd.
func twoDevices(t testing.TB, bOpts Options) (a, b *Realm, stopA func()) {
	t.Helper()
	ctx := context.Background()
	ep := etcdtest.New(t).Endpoints()
	a, err := Init(ctx, t.TempDir(), Options{Etcd: ep, NoPassphrase: true, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan struct{})
	served := make(chan error, 1)
	go func() {
		served <- a.Serve(sctx, ServeOptions{Listen: "127.0.0.1:0", Lease: 2 * time.Second, Ready: func(string, bool) { close(ready) }})
	}()
	select {
	case <-ready:
	case err2 := <-served:
		t.Fatalf("serve: %v", err2)
	}
	stopA = func() {
		cancel()
		if err2 := <-served; err2 != nil {
			t.Errorf("serve: %v", err2)
		}
	}
	t.Cleanup(func() {
		if sctx.Err() == nil {
			stopA()
		}
	})
	tok, err := a.Invite(ctx, InviteOptions{Role: pki.Device, Name: "b"})
	if err != nil {
		t.Fatal(err)
	}
	homeB := t.TempDir()
	if _, jerr := Join(ctx, homeB, tok, JoinOptions{NoPassphrase: true}); jerr != nil {
		t.Fatal(jerr)
	}
	bOpts.NoPassphrase = true
	if b, err = Open(ctx, homeB, bOpts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b, stopA
}

func writeFile(t testing.TB, r *Realm, name string, data []byte) {
	t.Helper()
	ctx := context.Background()
	v, err := r.Volume(ctx, DefaultVolume)
	if err != nil {
		t.Fatal(err)
	}
	root, err := v.Meta.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	if _, _, err := v.WriteFile(ctx, root, name, open, fs.Attrs{Mode: 0o644, Mtime: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func readFile(r *Realm, name string) ([]byte, []string, error) {
	ctx := context.Background()
	v, err := r.Volume(ctx, DefaultVolume)
	if err != nil {
		return nil, nil, err
	}
	e, err := v.Meta.Get(ctx, 1, name)
	if err != nil {
		return nil, nil, err
	}
	var buf bytes.Buffer
	err = v.ReadFile(ctx, e, nil, &buf)
	return buf.Bytes(), e.Current().Stores, err
}

// A file written on one device is read on another: its chunks stay in the
// writer's store, the version names that store, and the reader fetches
// them once into its chunk cache; a second read transfers nothing.
func TestReadFromAnotherDevice(t *testing.T) {
	a, b, stopA := twoDevices(t, Options{})
	data := make([]byte, 3<<20)
	rand.Read(data)
	writeFile(t, a, "f", data)

	got, stores, err := readFile(b, "f")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("b read different bytes")
	}
	if !slices.Equal(stores, []string{"a"}) {
		t.Fatalf("version stores %v, want [a]", stores)
	}
	st := b.CacheStats()
	if st.Fetches == 0 || st.FetchedBytes < int64(len(data)) {
		t.Fatalf("first read fetched %d objects, %d bytes", st.Fetches, st.FetchedBytes)
	}
	// b's own store holds none of it.
	bst, _ := b.Store(context.Background())
	n := 0
	bst.List(context.Background(), func(cairn.ID, int64) error { n++; return nil })
	if n != 0 {
		t.Fatalf("b's store holds %d objects after a read", n)
	}

	// Again, with a's node gone: everything comes from the cache.
	stopA()
	got, _, err = readFile(b, "f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("second read: %v", err)
	}
	if st2 := b.CacheStats(); st2.Fetches != st.Fetches {
		t.Fatalf("second read fetched %d more objects", st2.Fetches-st.Fetches)
	}

	// A file b has never read, while a is offline: a clear error.
	writeFile(t, a, "g", []byte("only on a"))
	_, _, err = readFile(b, "g")
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("read of a file held by an offline node: %v, want Unavailable", err)
	}
}

// Writing to another node's store (Options.Target): the chunks go there,
// the version names it, only what the node lacks is sent again.
func TestWriteToAnotherNode(t *testing.T) {
	a, b, _ := twoDevices(t, Options{Target: "a"})
	data := make([]byte, 2<<20)
	rand.Read(data)
	writeFile(t, b, "f", data)
	got, stores, err := readFile(a, "f")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a reads what b wrote to a's store: %v", err)
	}
	if !slices.Equal(stores, []string{"a"}) {
		t.Fatalf("stores %v", stores)
	}
	if n := a.CacheStats().Fetches; n != 0 {
		t.Fatalf("a fetched %d objects it holds itself", n)
	}
	bst, _ := b.Store(context.Background())
	n := 0
	bst.List(context.Background(), func(cairn.ID, int64) error { n++; return nil })
	if n != 0 {
		t.Fatalf("b's own store holds %d objects", n)
	}

	// An edit in the middle: a rewrite stores only a few new chunks.
	copy(data[1<<20:], []byte("an edit in the middle of the file"))
	v, _ := b.Volume(context.Background(), DefaultVolume)
	root, _ := v.Meta.Root(context.Background())
	_, ws, err := v.WriteFile(context.Background(), root, "f", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, fs.Attrs{Mode: 0o644})
	if err != nil {
		t.Fatal(err)
	}
	if ws.NewChunks > 3 || ws.DupChunks < ws.Chunks-3 {
		t.Fatalf("edit stored %d new chunks of %d", ws.NewChunks, ws.Chunks)
	}
	if got, _, err := readFile(a, "f"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after edit: %v", err)
	}
}

// A volume made after a device joined reaches it: the device learns the
// key from the metadata, where it is sealed with the realm's device key.
func TestVolumeMadeAfterJoin(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoDevices(t, Options{})
	if _, err := a.CreateVolume(ctx, "later", DefaultChunkAvg, 3, time.Hour); err != nil {
		t.Fatal(err)
	}
	va, err := a.Volume(ctx, "later")
	if err != nil {
		t.Fatal(err)
	}
	root, _ := va.Meta.Root(ctx)
	if _, _, werr := va.WriteFile(ctx, root, "x", func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader([]byte("made later"))), nil }, fs.Attrs{Mode: 0o644}); werr != nil {
		t.Fatal(werr)
	}
	vb, err := b.Volume(ctx, "later")
	if err != nil {
		t.Fatalf("b opens a volume made after it joined: %v", err)
	}
	e, err := vb.Meta.Get(ctx, 1, "x")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if rerr := vb.ReadFile(ctx, e, nil, &buf); rerr != nil || buf.String() != "made later" {
		t.Fatalf("read %q: %v", buf.String(), rerr)
	}
	// The key is now in b's keyring: it opens without the metadata's copy.
	kr, _ := b.Keyring()
	if _, kerr := kr.Key(vb.Meta.V.ID, "later"); kerr != nil {
		t.Fatal("b did not keep the learned key")
	}

	// What the metadata holds is ciphertext that only the device key opens.
	sealed, err := a.Meta.SealedKey(ctx, vb.Meta.V.ID)
	if err != nil {
		t.Fatal(err)
	}
	ka, _ := a.Keyring()
	m, _ := ka.Key(vb.Meta.V.ID, "later")
	if bytes.Contains(sealed, m[:]) {
		t.Fatal("the recorded key holds the master key in the clear")
	}
	var other [32]byte
	if _, err := openVolumeKey(other, a.Config.RealmID, vb.Meta.V.ID, sealed); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("another key opened it: %v", err)
	}
	dk, _ := ka.Key(deviceKeyID, "")
	if _, err := openVolumeKey(dk, a.Config.RealmID, "another-volume", sealed); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("the sealed key opened for another volume ID: %v", err)
	}
}

// A device whose device key is not the one the realm recorded cannot seal
// volume keys for the others: it is told to join again.
func TestForeignDeviceKeyRefused(t *testing.T) {
	ctx := context.Background()
	_, b, _ := twoDevices(t, Options{})
	kr, _ := b.Keyring()
	kr.Add(deviceKeyID, [32]byte{1, 2, 3})
	if _, err := b.deviceKey(ctx); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("a foreign device key: %v, want Permission", err)
	}
	if _, err := b.CreateVolume(ctx, "v2", DefaultChunkAvg, 3, time.Hour); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("create volume with a foreign device key: %v, want Permission", err)
	}
}
