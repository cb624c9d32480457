package surrogate

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zeebo/blake3"
	"golang.org/x/crypto/nacl/box"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// Config configures a surrogate service.
type Config struct {
	// Dir holds the staged chunks, a directory per client. Everything in
	// it is deleted when the server starts (soft state: nothing of a
	// former run is served) and a client's directory when its lease ends.
	// Required; created if missing.
	Dir string
	// Offer is the space offered to all clients together (bytes of
	// staged chunks). Required, > 0.
	Offer int64
	// Quota is the most one client is granted at registration (default
	// Offer/4, so that four clients fit; at most Offer). A client is
	// granted the smallest of Quota, what it asks for and what other
	// clients have not been granted.
	Quota int64
	// Lease is how long a registration lasts unless renewed. Default 1 h.
	Lease time.Duration
	// Window is how far a request's time may be from the surrogate's
	// clock, either way; a state-changing request's nonce is remembered
	// that long, so that a replay within it is refused and one after it
	// fails the time check. Default 2 min, at most Lease.
	Window time.Duration
	// MaxClients bounds the registrations held at once. Default 64.
	MaxClients int
	// MaxNonces bounds the nonces kept per client: a client making more
	// state-changing requests than this within one Window is told to slow
	// down (Kind Unavailable). Default 65536.
	MaxNonces int
	// Realm and Revocations admit the TLS client: a device of Realm whose
	// certificate is not revoked. Required.
	Realm       string
	Revocations pki.Revocations
	// Logger receives refusals. nil discards.
	Logger *slog.Logger
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time
}

// Server is a surrogate service: an http.Handler for the paths under
// PathPrefix. Make one with NewServer; Close it to wipe its data.
type Server struct {
	cfg  Config
	log  *slog.Logger
	stop chan struct{}
	done chan struct{}

	closeOnce sync.Once

	mu      sync.Mutex
	clients map[ClientID]*client
	granted int64 // sum of the clients' quotas
}

// client is one registration.
type client struct {
	id    ClientID
	key   [KeySize]byte
	quota int64
	dir   string

	mu      sync.Mutex // guards what follows, and the files in dir
	gone    bool       // deregistered or expired: dir is deleted
	expires time.Time
	used    int64
	chunks  map[cairn.ID]int64 // staged chunk → size
	nonces  map[Nonce]time.Time
}

// NewServer wipes cfg.Dir and returns the service. Its sweeper deletes
// expired registrations until Close.
func NewServer(cfg Config) (*Server, error) {
	const op = "surrogate"
	if cfg.Dir == "" {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("no directory for staged chunks"))
	}
	if cfg.Offer <= 0 {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("offer %d: want > 0 bytes", cfg.Offer))
	}
	if cfg.Quota <= 0 {
		cfg.Quota = max(cfg.Offer/4, 1)
	}
	cfg.Quota = min(cfg.Quota, cfg.Offer)
	if cfg.Lease <= 0 {
		cfg.Lease = time.Hour
	}
	if cfg.Window <= 0 {
		cfg.Window = 2 * time.Minute
	}
	cfg.Window = min(cfg.Window, cfg.Lease)
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 64
	}
	if cfg.MaxNonces <= 0 {
		cfg.MaxNonces = 1 << 16
	}
	if err := pki.ValidRealm(cfg.Realm); err != nil {
		return nil, err
	}
	if cfg.Revocations == nil {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("no revocation list"))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// Soft state: whatever a former run left is deleted, not served.
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, cairn.E(op, cairn.IO, cfg.Dir, err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, cairn.E(op, cairn.IO, cfg.Dir, err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, clients: map[ClientID]*client{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.sweeper()
	return s, nil
}

// Close stops the sweeper and deletes every client's data.
func (s *Server) Close() error {
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	close(s.stop)
	<-s.done
	s.mu.Lock()
	cs := make([]*client, 0, len(s.clients))
	for _, c := range s.clients {
		cs = append(cs, c)
	}
	clear(s.clients)
	s.granted = 0
	s.mu.Unlock()
	for _, c := range cs {
		c.wipe()
	}
	if err := os.RemoveAll(s.cfg.Dir); err != nil {
		return cairn.E("surrogate close", cairn.IO, s.cfg.Dir, err)
	}
	return nil
}

func (s *Server) sweeper() {
	defer close(s.done)
	t := time.NewTicker(max(min(s.cfg.Lease/8, time.Minute), 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.expire()
		}
	}
}

// expire deletes the registrations whose lease has ended. It never holds
// the server's lock while waiting for a client's (a client's lock is held
// through a stage's writes).
func (s *Server) expire() {
	now := s.cfg.Now()
	for _, c := range s.snapshot() {
		c.mu.Lock()
		ended := !now.Before(c.expires)
		c.mu.Unlock()
		if ended {
			s.log.Info("surrogate lease expired: client's chunks deleted", "client", c.id)
			s.drop(c)
		}
	}
}

// snapshot lists the registrations.
func (s *Server) snapshot() []*client {
	s.mu.Lock()
	defer s.mu.Unlock()
	cs := make([]*client, 0, len(s.clients))
	for _, c := range s.clients {
		cs = append(cs, c)
	}
	return cs
}

// wipe deletes the client's chunks; later requests of it find no client.
func (c *client) wipe() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gone = true
	c.chunks, c.nonces, c.used = nil, nil, 0
	_ = os.RemoveAll(c.dir)
}

// drop ends c's registration and deletes its data.
func (s *Server) drop(c *client) {
	s.mu.Lock()
	if s.clients[c.id] == c {
		delete(s.clients, c.id)
		s.granted -= c.quota
	}
	s.mu.Unlock()
	c.wipe()
}

// Stats is what a surrogate holds now (its node's report and tests).
type Stats struct {
	Clients int
	Granted int64
	Used    int64
	Chunks  int64
}

// Stats sums the live registrations.
func (s *Server) Stats() Stats {
	cs := s.snapshot()
	s.mu.Lock()
	st := Stats{Clients: len(cs), Granted: s.granted}
	s.mu.Unlock()
	for _, c := range cs {
		c.mu.Lock()
		st.Used += c.used
		st.Chunks += int64(len(c.chunks))
		c.mu.Unlock()
	}
	return st
}

// ServeHTTP implements http.Handler: a device of the realm (mutual TLS,
// checked on every request) may use the paths under PathPrefix.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	peer, leaf, err := pki.PeerIdentity(r.TLS)
	if err == nil {
		peer, err = pki.Admit(s.cfg.Realm, leaf, s.cfg.Revocations)
	}
	if err == nil && peer.Role != pki.Device {
		err = cairn.E("surrogate", cairn.Permission, peer.Name, fmt.Errorf("a %s may not use a surrogate: devices only", peer.Role))
	}
	if err != nil {
		status := http.StatusForbidden
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			status = http.StatusUnauthorized
		} else if cairn.KindOf(err) != cairn.Permission {
			status = http.StatusServiceUnavailable
		}
		s.log.Warn("surrogate request refused", "remote", r.RemoteAddr, "path", r.URL.Path, "err", err)
		s.fail(w, status, err)
		return
	}
	s.serve(w, r)
}

// serve routes an admitted request.
func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	want := http.MethodPost
	if p == PathInfo || strings.HasPrefix(p, PathChunk) {
		want = http.MethodGet
	}
	switch {
	case p == PathInfo, p == PathRegister, p == PathRenew, p == PathDeregister, p == PathStage, p == PathUnstage, strings.HasPrefix(p, PathChunk):
	default:
		s.fail(w, http.StatusNotFound, cairn.E("surrogate", cairn.NotFound, p, errors.New("no such endpoint")))
		return
	}
	if r.Method != want {
		s.fail(w, http.StatusMethodNotAllowed, cairn.E("surrogate", cairn.Invalid, p, fmt.Errorf("method %s not allowed, want %s", r.Method, want)))
		return
	}
	switch p {
	case PathInfo:
		s.reply(w, s.info())
		return
	case PathRegister:
		s.register(w, r)
		return
	}
	max := int64(0)
	switch p {
	case PathStage:
		max = MaxStageBytes
	case PathUnstage:
		max = MaxUnstageIDs * cairn.IDSize
	}
	body, err := readBody(r, max)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	c, err := s.authenticate(r, body, r.Method == http.MethodPost)
	if err != nil {
		s.log.Warn("surrogate request refused", "remote", r.RemoteAddr, "path", p, "err", err)
		s.fail(w, 0, err)
		return
	}
	switch {
	case p == PathRenew:
		s.renew(w, c)
	case p == PathDeregister:
		s.drop(c)
		w.WriteHeader(http.StatusNoContent)
	case p == PathStage:
		s.stage(w, c, body)
	case p == PathUnstage:
		s.unstage(w, c, body)
	default:
		s.get(w, c, strings.TrimPrefix(p, PathChunk))
	}
}

// readBody reads at most max bytes (a longer body is refused).
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength > max {
		return nil, cairn.E("surrogate", cairn.Invalid, r.URL.Path, fmt.Errorf("body of %d bytes exceeds %d", r.ContentLength, max))
	}
	if r.Body == nil {
		return nil, nil
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, cairn.E("surrogate", cairn.IO, r.URL.Path, err)
	}
	if int64(len(b)) > max {
		return nil, cairn.E("surrogate", cairn.Invalid, r.URL.Path, fmt.Errorf("body exceeds %d bytes", max))
	}
	return b, nil
}

func (s *Server) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.cfg.Offer - s.granted
	return Info{Format: Version, Offer: s.cfg.Offer, Free: free, Quota: min(s.cfg.Quota, free), Lease: s.cfg.Lease.Milliseconds(),
		Clients: len(s.clients), Now: s.cfg.Now().UTC()}
}

func (s *Server) register(w http.ResponseWriter, r *http.Request) {
	const op = "surrogate register"
	body, err := readBody(r, MaxRegisterBody)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	req, err := DecodeRegisterRequest(body)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	c := &client{chunks: map[cairn.ID]int64{}, nonces: map[Nonce]time.Time{}}
	if _, errIn := rand.Read(c.id[:]); errIn != nil {
		s.fail(w, 0, cairn.E(op, cairn.Other, "", errIn))
		return
	}
	if _, errIn := rand.Read(c.key[:]); errIn != nil {
		s.fail(w, 0, cairn.E(op, cairn.Other, "", errIn))
		return
	}
	var pub [KeySize]byte
	copy(pub[:], req.Key)
	sealed, err := box.SealAnonymous(nil, c.key[:], &pub, rand.Reader)
	if err != nil {
		s.fail(w, 0, cairn.E(op, cairn.Invalid, "", err))
		return
	}
	c.dir = filepath.Join(s.cfg.Dir, c.id.String())
	if errIn := os.Mkdir(c.dir, 0o700); errIn != nil {
		s.fail(w, 0, cairn.E(op, cairn.IO, c.dir, errIn))
		return
	}
	now := s.cfg.Now()
	c.expires = now.Add(s.cfg.Lease)
	s.mu.Lock()
	free := s.cfg.Offer - s.granted
	c.quota = min(s.cfg.Quota, free)
	if req.Want > 0 {
		c.quota = min(c.quota, req.Want)
	}
	switch {
	case len(s.clients) >= s.cfg.MaxClients:
		err = fmt.Errorf("%d clients registered already, the most this surrogate takes", len(s.clients))
	case c.quota <= 0:
		err = errors.New("all the offered space is granted to other clients")
	default:
		s.clients[c.id] = c
		s.granted += c.quota
	}
	s.mu.Unlock()
	if err != nil {
		_ = os.Remove(c.dir)
		s.fail(w, 0, cairn.E(op, cairn.Unavailable, "", err))
		return
	}
	s.log.Info("surrogate client registered", "client", c.id, "quota", c.quota, "expires", c.expires)
	s.reply(w, RegisterReply{Format: Version, Client: c.id.String(), Quota: c.quota, Sealed: sealed,
		Expires: c.expires.UTC(), Lease: s.cfg.Lease.Milliseconds(), Now: now.UTC()})
}

// authenticate finds the request's client and checks its MAC and time; a
// state-changing request's nonce must be new (it is then remembered until
// it falls out of the window). Every refusal is Kind Permission, but for a
// full nonce cache (Unavailable: retry later).
func (s *Server) authenticate(r *http.Request, body []byte, stateChanging bool) (*client, error) {
	const op = "surrogate authenticate"
	deny := func(err error) (*client, error) { return nil, cairn.E(op, cairn.Permission, r.URL.Path, err) }
	id, err := ParseClientID(r.Header.Get(HeaderClient))
	if err != nil {
		return deny(err)
	}
	at, err := ParseTime(r.Header.Get(HeaderTime))
	if err != nil {
		return deny(err)
	}
	nonce, err := ParseNonce(r.Header.Get(HeaderNonce))
	if err != nil {
		return deny(err)
	}
	mac, err := ParseMAC(r.Header.Get(HeaderMAC))
	if err != nil {
		return deny(err)
	}
	s.mu.Lock()
	c := s.clients[id]
	s.mu.Unlock()
	if c == nil {
		return deny(errors.New("no such client: never registered, deregistered, or its lease ended (its chunks are deleted)"))
	}
	if !hmac.Equal(mac, MAC(&c.key, r.Method, r.URL.Path, id, at.UnixMilli(), nonce, body)) {
		return deny(errors.New("bad MAC: not made with this client's session key over this request"))
	}
	now := s.cfg.Now()
	if d := now.Sub(at); d > s.cfg.Window || d < -s.cfg.Window {
		return deny(fmt.Errorf("request time %s is %v from the surrogate's clock, more than the window of %v (a replay, or a client that does not follow the surrogate's clock)", at.UTC().Format(time.RFC3339Nano), d.Round(time.Millisecond), s.cfg.Window))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone || !now.Before(c.expires) {
		return deny(errors.New("the client's lease ended (its chunks are deleted)"))
	}
	if !stateChanging {
		return c, nil
	}
	if _, seen := c.nonces[nonce]; seen {
		return deny(errors.New("nonce seen before: a replayed request"))
	}
	if len(c.nonces) >= s.cfg.MaxNonces {
		for n, until := range c.nonces {
			if now.After(until) {
				delete(c.nonces, n)
			}
		}
		if len(c.nonces) >= s.cfg.MaxNonces {
			return nil, cairn.E(op, cairn.Unavailable, r.URL.Path, fmt.Errorf("more than %d requests within %v: retry later", s.cfg.MaxNonces, s.cfg.Window))
		}
	}
	// Kept until its own time leaves the window: a later copy then fails
	// the time check instead.
	c.nonces[nonce] = at.Add(s.cfg.Window)
	return c, nil
}

func (s *Server) renew(w http.ResponseWriter, c *client) {
	now := s.cfg.Now()
	c.mu.Lock()
	c.expires = now.Add(s.cfg.Lease)
	exp := c.expires
	c.mu.Unlock()
	s.reply(w, LeaseReply{Format: Version, Expires: exp.UTC(), Lease: s.cfg.Lease.Milliseconds(), Now: now.UTC()})
}

func (c *client) usage() UsageReply {
	return UsageReply{Format: Version, Used: c.used, Chunks: int64(len(c.chunks)), Quota: c.quota}
}

// stage keeps a batch of chunks, all or none: a chunk whose bytes do not
// hash to its ID, or a batch that would pass the quota, refuses the whole
// batch. A chunk staged already is kept once (same ID, same bytes).
func (s *Server) stage(w http.ResponseWriter, c *client, body []byte) {
	const op = "surrogate stage"
	objs, err := DecodeStage(body)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	for _, o := range objs {
		if cairn.ID(blake3.Sum256(o.Data)) != o.ID {
			s.fail(w, 0, cairn.E(op, cairn.Corrupt, o.ID.String(), errors.New("data does not hash to its ID")))
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		s.fail(w, 0, cairn.E(op, cairn.Permission, "", errors.New("the client's lease ended")))
		return
	}
	fresh := make(map[cairn.ID]int64, len(objs))
	var add int64
	for _, o := range objs {
		if _, ok := c.chunks[o.ID]; ok {
			continue
		}
		if _, ok := fresh[o.ID]; ok {
			continue
		}
		fresh[o.ID] = int64(len(o.Data))
		add += int64(len(o.Data))
	}
	if c.used+add > c.quota {
		s.fail(w, 0, cairn.E(op, cairn.Permission, "", fmt.Errorf("quota exceeded: %d bytes staged, the batch adds %d, the quota is %d; unstage first", c.used, add, c.quota)))
		return
	}
	var written []cairn.ID
	for _, o := range objs {
		n, ok := fresh[o.ID]
		if !ok {
			continue
		}
		delete(fresh, o.ID)
		if err := writeChunk(c.dir, o.ID, o.Data); err != nil {
			for _, id := range written {
				_ = os.Remove(filepath.Join(c.dir, id.String()))
				delete(c.chunks, id)
			}
			kind := cairn.IO
			if errors.Is(err, syscall.ENOSPC) {
				kind = cairn.Unavailable // the disk filled below the offer
			}
			s.fail(w, 0, cairn.E(op, kind, o.ID.String(), err))
			return
		}
		c.chunks[o.ID] = n
		written = append(written, o.ID)
	}
	c.used += add
	s.reply(w, c.usage())
}

// writeChunk writes data to dir/<id> through a temporary file (a crash
// leaves no torn chunk under its ID; nothing is fsynced: soft state).
func writeChunk(dir string, id cairn.ID, data []byte) error {
	f, err := os.CreateTemp(dir, ".stage-*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, id.String()))
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// unstage deletes chunks; an ID not staged is no error.
func (s *Server) unstage(w http.ResponseWriter, c *client, body []byte) {
	const op = "surrogate unstage"
	ids, err := DecodeIDs(body)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		s.fail(w, 0, cairn.E(op, cairn.Permission, "", errors.New("the client's lease ended")))
		return
	}
	for _, id := range ids {
		n, ok := c.chunks[id]
		if !ok {
			continue
		}
		if err := os.Remove(filepath.Join(c.dir, id.String())); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.fail(w, 0, cairn.E(op, cairn.IO, id.String(), err))
			return
		}
		delete(c.chunks, id)
		c.used -= n
	}
	s.reply(w, c.usage())
}

func (s *Server) get(w http.ResponseWriter, c *client, target string) {
	const op = "surrogate get"
	id, err := cairn.ParseID(target)
	if err != nil {
		s.fail(w, 0, err)
		return
	}
	c.mu.Lock()
	_, ok := c.chunks[id]
	var data []byte
	if ok {
		data, err = os.ReadFile(filepath.Join(c.dir, id.String()))
	}
	c.mu.Unlock()
	switch {
	case !ok:
		s.fail(w, 0, cairn.E(op, cairn.NotFound, id.String(), errors.New("not staged by this client")))
		return
	case err != nil:
		s.fail(w, 0, cairn.E(op, cairn.IO, id.String(), err))
		return
	}
	w.Header().Set("Content-Type", wire.TypeObject)
	_, _ = w.Write(data)
}

func (s *Server) reply(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.fail(w, 0, cairn.E("surrogate reply", cairn.Other, "", err))
		return
	}
	w.Header().Set("Content-Type", wire.TypeJSON)
	_, _ = w.Write(b)
}

// fail writes err as the node wire's error reply (its Kind crosses).
func (s *Server) fail(w http.ResponseWriter, status int, err error) {
	if status == 0 {
		status = wire.Status(cairn.KindOf(err))
	}
	if status >= 500 && cairn.KindOf(err) != cairn.Unavailable {
		s.log.Error("surrogate request failed", "err", err)
	}
	w.Header().Set("Content-Type", wire.TypeJSON)
	w.Header().Set("Content-Encoding", wire.Zstd)
	w.WriteHeader(status)
	_, _ = w.Write(wire.EncodeError(err))
}
