package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/httpauth"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/mount"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/vpath"
	"cairn.dev/cairn/internal/web"
)

// defaultWebListen is where 'cairn web' listens without --listen: this
// machine only.
const defaultWebListen = "127.0.0.1:4920"

func (e *env) webCmd() *cobra.Command {
	var listen string
	var plain bool
	var hostnames []string
	c := &cobra.Command{
		Use:   "web [--listen ADDR] [--http] [--hostname NAME]...",
		Short: "Serve a web page of the realm: devices, stores, volumes, work in progress (and its JSON API)",
		Long: `Serve a web page at ADDR until Ctrl-C or SIGTERM showing the realm's devices and
nodes, its stores, its volumes, the work in progress on this device (running
mounts, the upload queue), a file's versions and the trash, kept up to date
every few seconds from a JSON API under /api/v1/ (doc/api.md) whose types are
those of the --json outputs of 'cairn devices', 'cairn store ls', 'cairn status',
'cairn versions' and 'cairn trash'.

HTTPS and passwords are those of 'cairn dav': a certificate of the realm CA
(clients trust $CAIRN_HOME/pki/node/ca.crt), --http only on a loopback address,
and the users and app passwords of 'cairn dav passwd'. The page only reads: it
reads the registry and the metadata service and never dials a node that is not
online, so it never wakes a sleeping device.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			loop, err := httpauth.IsLoopback(listen)
			if err != nil {
				return withCode(ExitUsage, fmt.Errorf("web: --listen: %w", err))
			}
			if plain && !loop {
				return withCode(ExitUsage, fmt.Errorf("web: refusing plain HTTP on %s, which is not a loopback address: "+
					"app passwords would cross the network in the clear (drop --http to serve HTTPS with a certificate of the realm CA)", listen))
			}
			return e.serveWeb(cmd.Context(), listen, plain, hostnames)
		},
	}
	c.Flags().StringVar(&listen, "listen", defaultWebListen, "address to serve on, host:port (port 0: any free port)")
	c.Flags().BoolVar(&plain, "http", false, "serve plain HTTP instead of HTTPS (only on a loopback address)")
	c.Flags().StringArrayVar(&hostnames, "hostname", nil, "a name clients use to reach this machine, put in the certificate (repeatable)")
	return c
}

func (e *env) serveWeb(ctx context.Context, listen string, plain bool, hostnames []string) error {
	users, err := e.gatewayUsers("web")
	if err != nil {
		return err
	}
	r, err := e.open(ctx)
	if err != nil {
		return err
	}
	creds, err := r.Credentials(ctx)
	if err != nil {
		return err
	}
	h, err := web.New(&webSource{e: e, r: r, device: creds.Identity.Name}, web.Options{Users: users, Logger: e.log, Metrics: metrics.Default().Handler()})
	if err != nil {
		return err
	}
	ln, tc, url, err := e.listenGateway(ctx, "web", r, listen, plain, hostnames)
	if err != nil {
		return err
	}
	// Last: scripts and tests wait for this line.
	fmt.Fprintf(e.stdout, "serving the web page at %s (pid %d)\n", url, os.Getpid())
	if err := httpauth.Serve(ctx, ln, h, tc, e.log); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "stopped")
	return nil
}

// webSource is the page's data, computed as the --json outputs compute it.
type webSource struct {
	e      *env
	r      *realm.Realm
	device string
}

func (s *webSource) Device() string { return s.device }

func (s *webSource) Devices(ctx context.Context) ([]apitypes.Device, error) {
	nodes, err := s.r.Meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	out := devicesOf(nodes)
	s.e.metaMembers(ctx, s.r, out) // where the metadata lives, as 'cairn devices --json' shows it
	return out, nil
}

// Stores asks every store as 'cairn store ls' does, except a node's
// store whose node is not online: that one is not dialed.
func (s *webSource) Stores(ctx context.Context) ([]apitypes.StoreInfo, error) {
	nodes, err := s.r.Meta.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	state := map[string]string{}
	for _, n := range nodes {
		state[n.Name] = n.State
	}
	infos, err := s.r.StoreInfosSkipping(ctx, func(rec meta.StoreRecord) string {
		return nodeStoreSkip(rec, state)
	})
	if infos == nil {
		infos = []apitypes.StoreInfo{}
	}
	return infos, err
}

func (s *webSource) Volumes(ctx context.Context) ([]apitypes.Volume, error) {
	vols, err := s.r.Meta.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]apitypes.Volume, 0, len(vols))
	for _, v := range vols {
		mv, err := s.r.Meta.Open(ctx, v.Name)
		if err != nil {
			return nil, err
		}
		av := apitypes.Volume{Name: v.Name, Created: time.Unix(0, v.Created).UTC(), ChunkAvg: v.ChunkAvg, KeepVersions: v.KeepVersions, TrashTTL: v.TrashTTL}
		err = mv.Walk(ctx, func(ent *meta.Entry, trashed bool) error {
			switch {
			case trashed || ent.Ino == meta.RootIno:
			case ent.Type == meta.TypeDir:
				av.Dirs++
			case ent.Type == meta.TypeFile:
				av.Files++
				av.Bytes += ent.Size
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if av.Policies, err = mv.Policies(ctx); err != nil {
			return nil, err
		}
		if av.Policies == nil {
			av.Policies = []meta.PolicyRecord{}
		}
		out = append(out, av)
	}
	return out, nil
}

// Status is what 'cairn status --json' prints.
func (s *webSource) Status(ctx context.Context) (*apitypes.Status, error) {
	all, err := mount.Running(ctx, runDir(s.e.home))
	if err != nil {
		return nil, err
	}
	return s.e.statusReport(ctx, all), nil
}

func (s *webSource) Work(ctx context.Context) (apitypes.Work, error) {
	w := apitypes.Work{Mounts: []apitypes.MountStatus{}}
	all, err := mount.Running(ctx, runDir(s.e.home))
	if err != nil {
		return w, err
	}
	if all != nil {
		w.Mounts = all
	}
	ql, err := s.e.queueList()
	if err != nil {
		return w, err
	}
	w.Queue = apitypes.Queue{Files: ql.Files, Bytes: ql.Bytes, Draining: ql.Draining}
	return w, nil
}

func (s *webSource) Versions(ctx context.Context, vol, path string) ([]apitypes.FileVersion, error) {
	p, err := vpath.Parse(vol + ":" + path)
	if err != nil {
		return nil, err
	}
	mv, err := s.r.Meta.Open(ctx, vol)
	if err != nil {
		return nil, err
	}
	ent, err := mv.Lookup(ctx, p.Parts)
	if err != nil {
		return nil, err
	}
	if ent.Type != meta.TypeFile {
		return nil, cairn.E("versions", cairn.IsDir, p.String(), errors.New("not a regular file"))
	}
	return versionsOf(ent), nil
}

func (s *webSource) Trash(ctx context.Context, vol string) ([]apitypes.TrashItem, error) {
	mv, err := s.r.Meta.Open(ctx, vol)
	if err != nil {
		return nil, err
	}
	items, err := mv.Trash(ctx)
	if err != nil {
		return nil, err
	}
	return trashOf(mv, items), nil
}

// Restore does what 'cairn restore' does for the page's buttons.
func (s *webSource) Restore(ctx context.Context, req apitypes.RestoreRequest) (*apitypes.RestoreResult, error) {
	p, err := vpath.Parse(req.Vol + ":" + req.Path)
	if err != nil {
		return nil, err
	}
	mv, err := s.r.Meta.Open(ctx, req.Vol)
	if err != nil {
		return nil, err
	}
	if req.FromTrash {
		dst := p
		if req.To != "" {
			if dst, err = vpath.Parse(req.Vol + ":" + req.To); err != nil {
				return nil, err
			}
		}
		removed, errIn := restoreFromTrash(ctx, mv, p, dst)
		if errIn != nil {
			return nil, errIn
		}
		return &apitypes.RestoreResult{Path: dst.String(), Removed: &removed}, nil
	}
	n, err := s.e.restoreVersion(ctx, mv, p, req.Version)
	if err != nil {
		return nil, err
	}
	return &apitypes.RestoreResult{Path: p.String(), Version: n}, nil
}

// Download reads version n (0: the current one) of a file as 'cairn cat
// --version N' does (a device that alone holds its data is woken, within
// the usual wake timeout: a download is a person's explicit request).
func (s *webSource) Download(ctx context.Context, vol, path string, n uint64) (int64, func(io.Writer) error, error) {
	p, err := vpath.Parse(vol + ":" + path)
	if err != nil {
		return 0, nil, err
	}
	v, err := s.r.Volume(ctx, vol)
	if err != nil {
		return 0, nil, err
	}
	ent, err := v.Meta.Lookup(ctx, p.Parts)
	if err != nil {
		return 0, nil, err
	}
	if ent.Type != meta.TypeFile {
		return 0, nil, cairn.E("download", cairn.IsDir, p.String(), errors.New("not a regular file"))
	}
	var ver *meta.Version // nil: the current one
	size := ent.Size
	if n != 0 {
		if ver, err = findVersion(ent, p.String(), n); err != nil {
			return 0, nil, err
		}
		size = ver.Size
	}
	return size, func(w io.Writer) error { return v.ReadFile(ctx, ent, ver, w) }, nil
}
