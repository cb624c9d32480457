// Package realm wires one installation together: its home directory, its
// configuration, the metadata service (embedded or external etcd), its
// stores and its keyring. Commands open a Realm and ask it for volumes.
package realm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/chunker"
	"cairn.dev/cairn/internal/director"
	"cairn.dev/cairn/internal/durable"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/keyring"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/vpath"
)

// ConfigVersion is the version of realm.json.
const ConfigVersion = 1

// Defaults for new volumes.
const (
	DefaultVolume       = "home"
	DefaultChunkAvg     = 16 << 10
	DefaultKeepVersions = 10
	DefaultTrashTTL     = 7 * 24 * time.Hour
)

// Config is realm.json: what a device knows about its realm.
type Config struct {
	Format  int       `json:"format"`
	RealmID string    `json:"realm_id"`
	Created time.Time `json:"created"`
	// Etcd lists external etcd endpoints; empty means the embedded one.
	Etcd []string `json:"etcd,omitempty"`
	// Gateway lists metadata gateways (host:port): the realm's etcd
	// reached over mutual TLS with this device's node certificate,
	// through any device that serves it. A device that joined a realm on
	// an embedded etcd has these instead of Etcd. Each open refreshes the
	// list from the realm's record of its metadata service (metasvc.go).
	Gateway []string `json:"gateway,omitempty"`
	// GatewayNode, in a config written before the realm recorded its
	// metadata service, named the one device whose certificate the
	// gateway had to carry. It is no longer checked: any device of the
	// realm may serve the metadata (cairn meta move), and a gateway must
	// present a device certificate of the realm. Cleared when the list
	// is first refreshed.
	GatewayNode string `json:"gateway_node,omitempty"`
	// Nodes are the chunk service addresses (host:port) of the realm's
	// devices, this one's included, as last seen: whom to ask where the
	// metadata service is when every gateway in Gateway is lost.
	Nodes []string `json:"nodes,omitempty"`
	// StorePath is the local store's directory, relative to the home.
	StorePath string `json:"store_path"`
	// User is the user this device belongs to (users.go); empty on a
	// device of a realm made before users, which is its owner's.
	User string `json:"user,omitempty"`
}

// DefaultHome returns $CAIRN_HOME, else $XDG_DATA_HOME/cairn, else
// ~/.local/share/cairn.
func DefaultHome() (string, error) {
	if h := os.Getenv("CAIRN_HOME"); h != "" {
		return h, nil
	}
	if x := os.Getenv("XDG_DATA_HOME"); x != "" {
		return filepath.Join(x, "cairn"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", cairn.E("find home", cairn.NotFound, "", errors.New("set CAIRN_HOME: no home directory"))
	}
	return filepath.Join(home, ".local", "share", "cairn"), nil
}

// Options for Init and Open.
type Options struct {
	// AllowOffline lets Open succeed when the metadata service cannot be
	// reached and this device holds local copies of namespaces
	// (doc/offline.md): the Realm's Meta is then offline and answers
	// reads of those volumes from them. For read-only commands.
	AllowOffline bool
	// Etcd overrides the configured endpoints (for Init: records them).
	Etcd []string
	// Passphrase is asked for when a sealed keyring must be opened, or for
	// Init when NoPassphrase is false.
	Passphrase   func() ([]byte, error)
	NoPassphrase bool // Init only: keep keys in a 0600 file, unsealed
	// Volume defaults, Init only.
	ChunkAvg     int
	KeepVersions int
	TrashTTL     time.Duration
	Workers      int
	// LockTTL is the lease time of writer locks (default 15 s): how long a
	// crashed writer can block others.
	LockTTL time.Duration
	// NodeName is this machine's node name (Init; and a realm made before
	// cairn had a CA, when it gets one). Default DefaultNodeName().
	NodeName string
	// Target names the node whose store receives what this process
	// writes (default: this device's own store). Versions record it as
	// where their chunks live.
	Target string
	// NoCache reads bypass this device's chunk cache (nothing is read
	// from it or added to it) and its own store, except for versions
	// whose data this device holds: reads go to the stores that hold
	// each version, so a person can check the remote copies.
	NoCache bool
	// CacheBytes bounds the chunk cache of data read from other nodes
	// (default DefaultCacheBytes).
	CacheBytes int64
	// WakeTimeout bounds how long a read waits for a sleeping node that
	// alone holds its data and that it woke (default
	// director.DefaultWakeTimeout); negative: reads never wake a node.
	WakeTimeout time.Duration
	// OnWake, if set, is told how a wake goes (the CLI shows it).
	OnWake director.WakeProgress
	// OffloadTo is where writes meant for a Target that is not awake go
	// instead (doc/director.md, "Offload and reclaim"): a node or
	// registered store, "" or "auto" for this device's own store (or the
	// first awake device or benefactor), "off" to fail such a write.
	OffloadTo string
	// MetaWait bounds how long opening the realm tries an unavailable
	// metadata service again, on a device that reaches it through
	// gateways (it may be moving, restarting or asleep): default
	// DefaultMetaWait; negative: try once.
	MetaWait time.Duration
	Logger   *slog.Logger
}

// Realm is an open realm.
type Realm struct {
	Home   string
	Config Config
	Meta   *meta.Service
	store  cairn.Store // opened on first use: commands on names alone never pay for it
	conn   *etcdsvc.Conn
	opts   Options
	keys   *keyring.Keyring
	vols   map[string]*fs.Volume
	log    *slog.Logger

	// The director chooses where bytes go and come from (fetch.go),
	// made on first need.
	dirMu    sync.Mutex
	director *director.Director
	// Registered stores (stores.go), opened on first need.
	remoteMu     sync.Mutex
	remoteClosed bool
	named        map[string]*namedStore // registered stores opened (stores.go)
	namedOpening map[string]*namedOpen  // registered stores being opened by namedStore
	pol          policyState            // placement policies' volumes (policy.go)
	revMu        sync.Mutex
	rev          *meta.Revocations
	name         string
	stopFollow   context.CancelFunc // followMetaService's watch
}

func (o *Options) fill() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ChunkAvg == 0 {
		o.ChunkAvg = DefaultChunkAvg
	}
	if o.KeepVersions == 0 {
		o.KeepVersions = DefaultKeepVersions
	}
	if o.TrashTTL == 0 {
		o.TrashTTL = DefaultTrashTTL
	}
	if o.Passphrase == nil {
		o.Passphrase = func() ([]byte, error) {
			return nil, cairn.E("passphrase", cairn.Permission, "", errors.New("the keyring is sealed: set CAIRN_PASSPHRASE"))
		}
	}
}

func configPath(home string) string  { return filepath.Join(home, "realm.json") }
func keyringPath(home string) string { return filepath.Join(home, "keyring") }

// Init creates a realm in home: keyring, metadata (embedded etcd unless
// opts.Etcd), a local store, the default volume "home", the realm CA and
// this device's node credentials (see CA), and its entry in the node
// registry.
func Init(ctx context.Context, home string, opts Options) (*Realm, error) {
	opts.fill()
	if opts.NodeName != "" {
		if err := pki.ValidName(opts.NodeName); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(configPath(home)); err == nil {
		return nil, cairn.E("init", cairn.Exist, home, errors.New("a realm already exists here"))
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return nil, cairn.E("init", cairn.IO, home, err)
	}
	var pass []byte
	if !opts.NoPassphrase {
		p, err := opts.Passphrase()
		if err != nil {
			return nil, err
		}
		if len(p) == 0 {
			return nil, cairn.E("init", cairn.Invalid, "", errors.New("empty passphrase (use --no-passphrase to keep keys unprotected)"))
		}
		pass = p
	}
	kr, err := keyring.Create(keyringPath(home), pass)
	if err != nil {
		return nil, err
	}
	cfg := Config{Format: ConfigVersion, RealmID: randomHex(12), Created: time.Now().UTC(), Etcd: opts.Etcd, StorePath: "store"}
	r, err := connect(ctx, home, cfg, opts)
	if err != nil {
		return nil, err
	}
	r.keys = kr
	if err := r.Meta.InitRealm(ctx, meta.RealmInfo{ID: cfg.RealmID, Created: cfg.Created.UnixNano(), Format: meta.FormatVersion}); err != nil {
		r.Close()
		return nil, err
	}
	// Create the local store now, so later commands only ever open it.
	if _, err := r.Store(ctx); err != nil {
		r.Close()
		return nil, err
	}
	if _, err := r.CreateVolume(ctx, DefaultVolume, opts.ChunkAvg, opts.KeepVersions, opts.TrashTTL); err != nil {
		r.Close()
		return nil, err
	}
	if _, err := r.createCA(ctx, opts.NodeName); err != nil {
		r.Close()
		return nil, err
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := durable.ReplaceFile(configPath(home), b, 0o600); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// Open opens the realm in home.
func Open(ctx context.Context, home string, opts Options) (*Realm, error) {
	opts.fill()
	cfg, err := readConfig(home)
	if err != nil {
		return nil, err
	}
	if len(opts.Etcd) > 0 {
		cfg.Etcd = opts.Etcd
	}
	// With local copies to fall back on, the service is asked for a short
	// while only.
	cctx, cancel := ctx, context.CancelFunc(func() {})
	// Not with the embedded service (this device runs it: starting it
	// may take longer than the try, and there is nothing to be offline
	// from).
	remote := len(cfg.Etcd) > 0 || len(cfg.Gateway) > 0
	offlineOK := opts.AllowOffline && remote && meta.HasLocalCopies(LocalCopyDir(home))
	if offlineOK {
		cctx, cancel = context.WithTimeout(ctx, offlineTry)
	}
	defer cancel()
	unreachable := func(err error) bool {
		return offlineOK && (cairn.KindOf(err) == cairn.Unavailable || (cctx.Err() != nil && ctx.Err() == nil))
	}
	r, err := connect(cctx, home, cfg, opts)
	if err != nil {
		if unreachable(err) {
			return openOffline(home, cfg, opts, err)
		}
		return nil, err
	}
	info, err := r.Meta.Realm(cctx)
	if err != nil {
		r.Close()
		if unreachable(err) {
			return openOffline(home, cfg, opts, err)
		}
		if errors.Is(err, cairn.ErrNotFound) {
			return nil, cairn.E("open realm", cairn.NotFound, strings.Join(cfg.Etcd, ","), errors.New("the metadata service holds no realm"))
		}
		return nil, err
	}
	if info.ID != cfg.RealmID {
		r.Close()
		return nil, cairn.E("open realm", cairn.Invalid, home, fmt.Errorf("metadata service holds realm %s, this device belongs to %s", info.ID, cfg.RealmID))
	}
	if info.Format > meta.RecordFormat {
		r.Close()
		return nil, cairn.E("open realm", cairn.Invalid, home, fmt.Errorf("the realm's metadata is at format %d (a newer cairn wrote it); this cairn reads up to %d: upgrade cairn on this device", info.Format, meta.RecordFormat))
	}
	if err := r.learnMetaService(ctx); err != nil {
		// The cached list stays as it was: this open works all the same.
		r.log.Warn("refresh where the metadata service is", "err", err)
	}
	r.followMetaService()
	return r, nil
}

// readConfig reads home's realm.json.
func readConfig(home string) (Config, error) {
	var cfg Config
	b, err := os.ReadFile(configPath(home))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return cfg, cairn.E("open realm", cairn.NotFound, home, errors.New("no realm here: run 'cairn init' (or set CAIRN_HOME)"))
		}
		return cfg, cairn.E("open realm", cairn.IO, home, err)
	}
	if err = json.Unmarshal(b, &cfg); err != nil {
		return cfg, cairn.E("open realm", cairn.Corrupt, configPath(home), err)
	}
	if cfg.Format != ConfigVersion {
		return cfg, cairn.E("open realm", cairn.Invalid, configPath(home), fmt.Errorf("realm format %d; this cairn reads %d", cfg.Format, ConfigVersion))
	}
	return cfg, nil
}

func connect(ctx context.Context, home string, cfg Config, opts Options) (*Realm, error) {
	var conn *etcdsvc.Conn
	var err error
	switch {
	case len(opts.Etcd) == 0 && len(cfg.Gateway) > 0:
		conn, cfg.Gateway, err = connectGateways(ctx, home, cfg, opts.MetaWait)
	case len(cfg.Etcd) > 0:
		conn, err = etcdsvc.ConnectExternal(ctx, cfg.Etcd, etcdsvc.ConnectOptions{})
	default:
		conn, err = etcdsvc.Connect(ctx, home, etcdsvc.ConnectOptions{})
	}
	if err != nil {
		return nil, err
	}
	ms, err := meta.New(conn.Client(), meta.Options{Logger: opts.Logger, LockTTL: opts.LockTTL, LocalCopyDir: LocalCopyDir(home)})
	if err != nil {
		conn.Close()
		return nil, err
	}
	ms.SetPrincipal(principal(home, cfg))
	return &Realm{Home: home, Config: cfg, Meta: ms, conn: conn, opts: opts, vols: map[string]*fs.Volume{}, log: opts.Logger}, nil
}

// Store opens the realm's local store on first use.
func (r *Realm) Store(ctx context.Context) (cairn.Store, error) {
	if r.store == nil {
		st, err := localstore.Open(ctx, filepath.Join(r.Home, r.Config.StorePath),
			// IDs come from this process's own pipeline, which has just
			// computed them (a node verifies what remote clients send), so
			// Put need not hash again; reads still verify.
			localstore.Options{Logger: r.log, TrustIDs: true})
		if err != nil {
			return nil, err
		}
		// Counted as store "local" in the process's metrics (/metrics).
		r.store = metrics.Default().WrapStore("local", st)
	}
	return r.store, nil
}

// Close releases everything the realm holds.
func (r *Realm) Close() error {
	for _, v := range r.vols {
		v.Close()
	}
	r.closePolicies() // the policy volumes
	// The director's wrappers, cache and node clients, before the stores
	// they write to.
	r.dir().Close()
	r.remoteMu.Lock()
	r.remoteClosed = true // no read opens a registered store again
	if len(r.named) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.flushRequestsLocked(ctx)
		cancel()
		for _, n := range r.named {
			n.st.Close()
		}
	}
	r.remoteMu.Unlock()
	r.revMu.Lock()
	if r.rev != nil {
		r.rev.Close()
	}
	r.revMu.Unlock()
	if r.stopFollow != nil {
		r.stopFollow()
	}
	err := r.Meta.Close()
	if r.store != nil {
		if e := r.store.Close(); err == nil {
			err = e
		}
	}
	if e := r.conn.Close(); err == nil {
		err = e
	}
	return err
}

// Keyring opens the keyring on first use (asking for the passphrase then).
func (r *Realm) Keyring() (*keyring.Keyring, error) {
	if r.keys == nil {
		k, err := keyring.Open(keyringPath(r.Home), r.opts.Passphrase)
		if err != nil {
			return nil, err
		}
		r.keys = k
	}
	return r.keys, nil
}

// CreateVolume makes a new volume with a fresh key.
func (r *Realm) CreateVolume(ctx context.Context, name string, chunkAvg, keep int, trashTTL time.Duration) (*meta.Volume, error) {
	if err := vpath.ValidVolume(name); err != nil {
		return nil, cairn.E("create volume", cairn.Invalid, name, err)
	}
	p := chunker.Params{Min: chunkAvg / 4, Avg: chunkAvg, Max: chunkAvg * 8}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if keep < 1 {
		return nil, cairn.E("create volume", cairn.Invalid, name, errors.New("must keep at least 1 version"))
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, err
	}
	master := keyring.NewMaster()
	v := meta.Volume{Name: name, ID: randomHex(12), Created: time.Now().UnixNano(), KeyCheck: fs.KeyCheck(master),
		ChunkMin: p.Min, ChunkAvg: p.Avg, ChunkMax: p.Max, KeepVersions: keep, TrashTTL: trashTTL}
	// The key is saved before the volume exists, so a volume never exists
	// without its key; a crash in between leaves only an unused key.
	kr.Add(v.ID, master)
	if err = kr.Save(); err != nil {
		return nil, err
	}
	// The realm's other devices learn it from the metadata, sealed.
	dk, err := r.deviceKey(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.publishKey(ctx, dk, v.ID, master); err != nil {
		return nil, err
	}
	if err := r.Meta.CreateVolume(ctx, v, 0o755, uint32(os.Getuid()), uint32(os.Getgid())); err != nil {
		return nil, err
	}
	return &v, nil
}

// readahead is how many chunks a read keeps in flight: enough to hide the
// round trips to another node (128 chunks: 2 MiB at the default size; a
// local store reads as fast with it).
const readahead = 128

// cloudReadahead is how many chunks a whole-file read of data in a cloud
// store keeps in flight (32 MiB at the default size): the pack store reads
// a pack whole once the read enters it (realm.packed), so this keeps the
// next one or two packs' GETs in flight while one is consumed; with 8 MiB
// ahead the read waited at each 16 MiB pack's start for its GET.
const cloudReadahead = 2048

// Volume opens a volume by name (its key from the keyring).
func (r *Realm) Volume(ctx context.Context, name string) (*fs.Volume, error) {
	if v, ok := r.vols[name]; ok {
		return v, nil
	}
	v, err := r.openVolume(ctx, name)
	if err != nil {
		return nil, err
	}
	r.vols[name] = v
	return v, nil
}

// openVolume opens a volume by name, not kept in r.vols: the caller
// closes it (the pin keeper, which runs beside the node's other work).
func (r *Realm) openVolume(ctx context.Context, name string) (*fs.Volume, error) {
	mv, err := r.Meta.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	master, epochs, err := r.volumeKeys(ctx, &mv.V)
	if err != nil {
		return nil, err
	}
	w, err := r.dir().ForWrite(ctx, "")
	if err != nil {
		return nil, err
	}
	return fs.OpenFor(r.Meta, mv, master, w, fs.Options{Workers: r.opts.Workers, Readahead: readahead, ReadaheadFor: r.readaheadFor, Epochs: epochs, Logger: r.log})
}

// AllVolumes opens every volume of the realm.
func (r *Realm) AllVolumes(ctx context.Context) ([]*fs.Volume, error) {
	list, err := r.Meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	var out []*fs.Volume
	for _, mv := range list {
		v, err := r.Volume(ctx, mv.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
