package realm

import (
	"path/filepath"
	"time"

	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/fs"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

// LocalCopyDir is where a device keeps its local copies of the namespaces
// it uses (doc/offline.md): a file per volume ID.
func LocalCopyDir(home string) string { return filepath.Join(home, "offline") }

// offlineTry is how long Open (with AllowOffline, and local copies to
// serve) tries to reach the metadata service before it opens offline.
const offlineTry = 3 * time.Second

// openOffline opens the realm without its metadata service, which could
// not be reached (cause): its Meta is offline, answers the volumes this
// device holds local copies of from them, and turns online by itself
// when the service answers again.
func openOffline(home string, cfg Config, opts Options, cause error) (*Realm, error) {
	var conn *etcdsvc.Conn
	var err error
	switch {
	case len(opts.Etcd) == 0 && len(cfg.Gateway) > 0:
		creds, cerr := pki.LoadCredentials(CredentialsDir(home))
		if cerr != nil {
			return nil, cause
		}
		tlsConf, terr := pki.ClientTLS(creds, pki.TLSOptions{Revocations: pki.NoRevocations{}, Peer: pki.RequireRole(pki.Device)})
		if terr != nil {
			return nil, cause
		}
		conn, err = etcdsvc.ConnectLazy(cfg.Gateway, etcdsvc.ConnectOptions{TLS: tlsConf})
	case len(cfg.Etcd) > 0:
		conn, err = etcdsvc.ConnectLazy(cfg.Etcd, etcdsvc.ConnectOptions{})
	default:
		// The embedded service runs on this device: nothing to be
		// offline from.
		return nil, cause
	}
	if err != nil {
		return nil, cause
	}
	ms, err := meta.New(conn.Client(), meta.Options{Logger: opts.Logger, LockTTL: opts.LockTTL, LocalCopyDir: LocalCopyDir(home)})
	if err != nil {
		conn.Close()
		return nil, err
	}
	ms.SetPrincipal(principal(home, cfg))
	ms.MarkUnreachable(cause)
	return &Realm{Home: home, Config: cfg, Meta: ms, conn: conn, opts: opts, vols: map[string]*fs.Volume{}, log: opts.Logger}, nil
}

// Offline reports whether the realm works without its metadata service.
func (r *Realm) Offline() bool {
	_, off := r.Meta.Offline()
	return off
}
