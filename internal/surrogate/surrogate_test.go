package surrogate

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/pki"
)

// A device registers, stages a batch of real chunks, reads each back and
// decodes it; unstaging frees the space; deregistering deletes the chunks.
func TestRoundTrip(t *testing.T) {
	f := start(t, nil)
	ctx := t.Context()
	c := f.client("laptop")
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Offer != 1<<20 || in.Free != 1<<20 || in.Clients != 0 {
		t.Fatalf("info %+v", in)
	}
	s := f.register(c)
	if s.Quota() != 1<<18 || time.Until(s.Expires()) < 59*time.Minute {
		t.Fatalf("quota %d, expires in %v", s.Quota(), time.Until(s.Expires()))
	}
	cs := []chunk{newChunk(t, 1000), newChunk(t, 20000), newChunk(t, 0)}
	u, err := s.Stage(ctx, objs(cs...))
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, ch := range cs {
		total += int64(len(ch.stored))
	}
	if u.Used != total || u.Chunks != 3 || u.Quota != 1<<18 {
		t.Fatalf("usage %+v, want %d bytes in 3 chunks", u, total)
	}
	// Staging again counts nothing twice.
	if u, err = s.Stage(ctx, objs(cs[0], cs[0])); err != nil || u.Used != total {
		t.Fatalf("stage again: %+v, %v", u, err)
	}
	for i, ch := range cs {
		b, err := s.Get(ctx, ch.ref.ID)
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		plain, err := pipeline.DecodeChunk(ch.ref, b)
		if err != nil || !bytes.Equal(plain, ch.plain) {
			t.Fatalf("decode %d: %v", i, err)
		}
	}
	if u, err = s.Unstage(ctx, []cairn.ID{cs[1].ref.ID, cs[1].ref.ID}); err != nil || u.Used != total-int64(len(cs[1].stored)) || u.Chunks != 2 {
		t.Fatalf("unstage: %+v, %v", u, err)
	}
	_, err = s.Get(ctx, cs[1].ref.ID)
	wantKind(t, "get unstaged", err, cairn.NotFound)
	exp := s.Expires()
	time.Sleep(2 * time.Millisecond)
	if e, err := s.Renew(ctx); err != nil || !e.After(exp) {
		t.Fatalf("renew: %v, %v (was %v)", e, err, exp)
	}
	if in, err = c.Info(ctx); err != nil || in.Clients != 1 || in.Free != 3<<18 {
		t.Fatalf("info %+v, %v", in, err)
	}
	if err := s.Deregister(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, cs[0].ref.ID)
	wantKind(t, "get after deregister", err, cairn.Permission)
	if ents, _ := os.ReadDir(f.dir); len(ents) != 0 {
		t.Fatalf("after deregister the surrogate keeps %d entries", len(ents))
	}
	if st := f.srv.Stats(); st.Clients != 0 || st.Granted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// send makes one authenticated request with the given headers.
func send(t *testing.T, s *Session, method, path string, body []byte, h http.Header) error {
	t.Helper()
	_, err := s.c.do(t.Context(), "test", method, path, body, h, MaxReply)
	return err
}

// A request sent twice is refused the second time; one whose time lies
// outside the window is refused too (its nonce is no longer remembered).
func TestReplayRefused(t *testing.T) {
	f := start(t, nil)
	s := f.register(f.client("laptop"))
	ch := newChunk(t, 500)
	body := AppendObject(nil, ch.ref.ID, ch.stored)
	h, err := s.headers(http.MethodPost, PathStage, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := send(t, s, http.MethodPost, PathStage, body, h); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Unstage(t.Context(), []cairn.ID{ch.ref.ID}); err != nil {
		t.Fatal(err)
	}
	err = send(t, s, http.MethodPost, PathStage, body, h)
	wantKind(t, "replayed stage", err, cairn.Permission)
	if _, err := s.Get(t.Context(), ch.ref.ID); cairn.KindOf(err) != cairn.NotFound {
		t.Fatalf("the replay staged the chunk again: %v", err)
	}
	// The same for a renew and a deregister.
	h, _ = s.headers(http.MethodPost, PathDeregister, nil)
	hr, _ := s.headers(http.MethodPost, PathRenew, nil)
	if err := send(t, s, http.MethodPost, PathRenew, nil, hr); err != nil {
		t.Fatal(err)
	}
	wantKind(t, "replayed renew", send(t, s, http.MethodPost, PathRenew, nil, hr), cairn.Permission)
	// A request made with a time two windows old: refused although its
	// nonce is new.
	old := time.Now().Add(-2 * f.srv.cfg.Window).UnixMilli()
	var n Nonce
	n[0] = 1
	stale := http.Header{
		HeaderClient: {s.id.String()}, HeaderTime: {strconv.FormatInt(old, 10)}, HeaderNonce: {"01000000000000000000000000000000"},
		HeaderMAC: {hexMAC(&s.key, http.MethodPost, PathRenew, s.id, old, n, nil)},
	}
	wantKind(t, "stale renew", send(t, s, http.MethodPost, PathRenew, nil, stale), cairn.Permission)
	if err := send(t, s, http.MethodPost, PathDeregister, nil, h); err != nil {
		t.Fatal(err)
	}
}

func hexMAC(key *[KeySize]byte, method, path string, id ClientID, ms int64, n Nonce, body []byte) string {
	m := MAC(key, method, path, id, ms, n, body)
	const hexd = "0123456789abcdef"
	out := make([]byte, 0, 2*len(m))
	for _, b := range m {
		out = append(out, hexd[b>>4], hexd[b&15])
	}
	return string(out)
}

// A MAC that is not the session's over this very request is refused: a
// flipped bit, a MAC for another body, another session's key.
func TestWrongMACRefused(t *testing.T) {
	f := start(t, nil)
	c := f.client("laptop")
	s := f.register(c)
	ch := newChunk(t, 500)
	body := AppendObject(nil, ch.ref.ID, ch.stored)

	h, _ := s.headers(http.MethodPost, PathStage, body)
	m := []byte(h.Get(HeaderMAC))
	if m[0] == '0' {
		m[0] = '1'
	} else {
		m[0] = '0'
	}
	h.Set(HeaderMAC, string(m))
	wantKind(t, "flipped MAC", send(t, s, http.MethodPost, PathStage, body, h), cairn.Permission)

	h, _ = s.headers(http.MethodPost, PathStage, body)
	other := newChunk(t, 500)
	wantKind(t, "MAC of another body", send(t, s, http.MethodPost, PathStage, AppendObject(nil, other.ref.ID, other.stored), h), cairn.Permission)

	s2 := f.register(c)
	h, _ = s2.headers(http.MethodPost, PathStage, body)
	h.Set(HeaderClient, s.id.String())
	wantKind(t, "another session's key", send(t, s, http.MethodPost, PathStage, body, h), cairn.Permission)

	wantKind(t, "no MAC", send(t, s, http.MethodPost, PathStage, body, nil), cairn.Permission)
	if st := f.srv.Stats(); st.Chunks != 0 {
		t.Fatalf("a refused stage kept %d chunks", st.Chunks)
	}
}

// A batch that would pass the quota is refused whole; a registration
// beyond the offer is refused.
func TestQuotaExceeded(t *testing.T) {
	f := start(t, func(c *Config) { c.Offer, c.Quota = 100000, 60000 })
	ctx := t.Context()
	c := f.client("laptop")
	s := f.register(c)
	if s.Quota() != 60000 {
		t.Fatalf("quota %d", s.Quota())
	}
	a, b := newChunk(t, 40000), newChunk(t, 30000)
	if _, err := s.Stage(ctx, objs(a)); err != nil {
		t.Fatal(err)
	}
	small := newChunk(t, 100)
	_, err := s.Stage(ctx, objs(small, b))
	wantKind(t, "stage past the quota", err, cairn.Permission)
	for _, ch := range []chunk{small, b} {
		if _, err := s.Get(ctx, ch.ref.ID); cairn.KindOf(err) != cairn.NotFound {
			t.Fatalf("a chunk of the refused batch is staged: %v", err)
		}
	}
	if u, err := s.Unstage(ctx, []cairn.ID{a.ref.ID}); err != nil || u.Used != 0 {
		t.Fatalf("unstage: %+v, %v", u, err)
	}
	if _, err := s.Stage(ctx, objs(small, b)); err != nil {
		t.Fatalf("after unstaging: %v", err)
	}
	// The second client gets what is left of the offer; a third none.
	if s2, err := c.Register(ctx, 50000); err != nil || s2.Quota() != 40000 {
		t.Fatalf("second quota: %v", err)
	}
	_, err = c.Register(ctx, 0)
	wantKind(t, "register past the offer", err, cairn.Unavailable)
}

// A lease that is not renewed ends: the chunks are deleted from disk and
// the session's requests are refused. A renewed one lives on.
func TestLeaseExpiryWipes(t *testing.T) {
	f := start(t, func(c *Config) { c.Lease = 400 * time.Millisecond })
	ctx := t.Context()
	c := f.client("laptop")
	s, kept := f.register(c), f.register(c)
	ch := newChunk(t, 1000)
	for _, x := range []*Session{s, kept} {
		if _, err := x.Stage(ctx, objs(ch)); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(f.dir, s.ID().String())
	if _, err := os.Stat(filepath.Join(dir, ch.ref.ID.String())); err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(700 * time.Millisecond)
	for time.Now().Before(end) {
		if _, err := kept.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, "expired client's directory deleted", 2*time.Second, func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
	_, err := s.Get(ctx, ch.ref.ID)
	wantKind(t, "get after expiry", err, cairn.Permission)
	_, err = s.Renew(ctx)
	wantKind(t, "renew after expiry", err, cairn.Permission)
	if _, err := kept.Get(ctx, ch.ref.ID); err != nil {
		t.Fatalf("the renewed session lost its chunk: %v", err)
	}
}

// A surrogate that restarts (here: crashes, and a new one starts on the
// same directory) serves nothing of the former run and keeps none of it.
func TestRestartWipes(t *testing.T) {
	f := start(t, nil)
	ctx := t.Context()
	s := f.register(f.client("laptop"))
	ch := newChunk(t, 1000)
	if _, err := s.Stage(ctx, objs(ch)); err != nil {
		t.Fatal(err)
	}
	f.serve() // the old server is left running, as after a crash nothing cleans up
	ents, err := os.ReadDir(f.dir)
	if err != nil || len(ents) != 0 {
		t.Fatalf("after a restart the directory holds %d entries (%v)", len(ents), err)
	}
	s.c = f.client("laptop") // the new address
	_, err = s.Get(ctx, ch.ref.ID)
	wantKind(t, "get from the restarted surrogate", err, cairn.Permission)
	s2 := f.register(s.c)
	if _, err := s2.Get(ctx, ch.ref.ID); cairn.KindOf(err) != cairn.NotFound {
		t.Fatalf("a new session sees a chunk of the former run: %v", err)
	}
}

// One session cannot read, unstage or act on another session's chunks,
// even knowing their IDs and the other's client ID.
func TestSessionsIsolated(t *testing.T) {
	f := start(t, nil)
	ctx := t.Context()
	a := f.register(f.client("laptop"))
	b := f.register(f.client("phone"))
	ch := newChunk(t, 1000)
	if _, err := a.Stage(ctx, objs(ch)); err != nil {
		t.Fatal(err)
	}
	_, err := b.Get(ctx, ch.ref.ID)
	wantKind(t, "get another session's chunk", err, cairn.NotFound)
	if _, err := b.Unstage(ctx, []cairn.ID{ch.ref.ID}); err != nil {
		t.Fatal(err)
	}
	// b claims a's client ID: its MAC is not made with a's key.
	h, _ := b.headers(http.MethodPost, PathUnstage, EncodeIDs([]cairn.ID{ch.ref.ID}))
	h.Set(HeaderClient, a.id.String())
	wantKind(t, "unstage as another client", send(t, b, http.MethodPost, PathUnstage, EncodeIDs([]cairn.ID{ch.ref.ID}), h), cairn.Permission)
	h, _ = b.headers(http.MethodGet, PathChunk+ch.ref.ID.String(), nil)
	h.Set(HeaderClient, a.id.String())
	wantKind(t, "get as another client", send(t, b, http.MethodGet, PathChunk+ch.ref.ID.String(), nil, h), cairn.Permission)
	if got, err := a.Get(ctx, ch.ref.ID); err != nil || !bytes.Equal(got, ch.stored) {
		t.Fatalf("a lost its chunk: %v", err)
	}
}

// A chunk damaged or substituted on the surrogate's disk is caught by Get
// (its bytes do not hash to its ID), and would be by the decode's AEAD tag.
func TestCorruptChunkDetected(t *testing.T) {
	f := start(t, nil)
	ctx := t.Context()
	s := f.register(f.client("laptop"))
	x, y := newChunk(t, 3000), newChunk(t, 3000)
	if _, err := s.Stage(ctx, objs(x, y)); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(f.dir, s.ID().String())
	px, py := filepath.Join(dir, x.ref.ID.String()), filepath.Join(dir, y.ref.ID.String())
	b, _ := os.ReadFile(px)
	b[len(b)-1] ^= 1 // the AEAD tag's last byte
	if err := os.WriteFile(px, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.Get(ctx, x.ref.ID)
	wantKind(t, "damaged chunk", err, cairn.Corrupt)
	if _, err := pipeline.DecodeChunk(x.ref, b); cairn.KindOf(err) != cairn.Corrupt {
		t.Fatalf("the decode took the damaged chunk: %v", err)
	}
	// Substituted: y's file holds x's original bytes.
	if err := os.WriteFile(py, x.stored, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = s.Get(ctx, y.ref.ID)
	wantKind(t, "substituted chunk", err, cairn.Corrupt)
	// A client staging bytes under a wrong ID is refused (a confused
	// pump stages nothing it would later read as corrupt).
	_, err = s.Stage(ctx, []Object{{ID: x.ref.ID, Data: y.stored}})
	wantKind(t, "stage under a wrong ID", err, cairn.Corrupt)
}

// Only the realm's devices use a surrogate; a device's client talks only to
// a surrogate of its realm's CA.
func TestRoles(t *testing.T) {
	f := start(t, nil)
	ctx := t.Context()
	_, err := f.clientAs("ben", pki.Benefactor).Register(ctx, 0)
	wantKind(t, "a benefactor registers", err, cairn.Permission)
	if _, err := f.client("laptop").Info(ctx); err != nil {
		t.Fatalf("a device of the realm: %v", err)
	}
	// A device's client refuses a server that is no surrogate.
	devTLS, err := pki.ClientTLS(f.creds("laptop", pki.Device), pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(f.addr, devTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Info(ctx); err == nil {
		t.Fatal("a client wanting a device's server talked to the surrogate")
	}
	// A device of another CA is refused by the handshake.
	other := start(t, nil)
	sTLS, err := ClientTLS(other.creds("x", pki.Device), pki.NoRevocations{})
	if err != nil {
		t.Fatal(err)
	}
	cross, err := NewClient(f.addr, sTLS)
	if err != nil {
		t.Fatal(err)
	}
	defer cross.Close()
	if _, err := cross.Info(ctx); err == nil {
		t.Fatal("a device of another CA was let in")
	}
}

// Measure gives a round trip and both rates, names the surrogate by its
// certificate, and leaves no session behind.
func TestMeasure(t *testing.T) {
	f := start(t, nil)
	c := f.client("laptop")
	m, err := Measure(t.Context(), c, 3, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if m.RTT <= 0 || m.Up <= 0 || m.Down <= 0 || m.ProbeBytes != 64<<10 || m.Info.Offer != 1<<20 {
		t.Fatalf("measurement %+v", m)
	}
	if c.Name() != "sur" {
		t.Fatalf("name %q", c.Name())
	}
	if st := f.srv.Stats(); st.Clients != 0 {
		t.Fatalf("the probe session is left: %+v", st)
	}
}

// A client making more state-changing requests within one window than
// the nonce cache holds is told to retry (Unavailable), and can once its
// nonces have left the window.
func TestNonceCacheBounded(t *testing.T) {
	f := start(t, func(c *Config) { c.MaxNonces, c.Window = 3, 300*time.Millisecond })
	s := f.register(f.client("laptop"))
	for range 3 {
		if _, err := s.Renew(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.Renew(t.Context())
	wantKind(t, "renew past the nonce cache", err, cairn.Unavailable)
	time.Sleep(400 * time.Millisecond)
	if _, err := s.Renew(t.Context()); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// A device whose certificate the realm revoked is refused, on a
// connection made before the revocation too.
func TestRevokedDeviceRefused(t *testing.T) {
	rev := pki.NewRevocationList()
	f := start(t, func(c *Config) { c.Revocations = rev })
	c := f.client("laptop")
	s := f.register(c)
	if err := rev.RevokeName("laptop"); err != nil {
		t.Fatal(err)
	}
	_, err := s.Renew(t.Context())
	wantKind(t, "renew of a revoked device", err, cairn.Permission)
	_, err = c.Register(t.Context(), 0)
	wantKind(t, "register of a revoked device", err, cairn.Permission)
}
