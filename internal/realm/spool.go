package realm

import (
	"context"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/fs"
)

// SpoolVolume opens volume name over st, a spool store of this device
// that no garbage collection sweeps (the upload queue's: see
// doc/format.md, "Upload queue"), for fs.Volume.Stage. The handle is the
// caller's to close; st stays open.
func (r *Realm) SpoolVolume(ctx context.Context, name string, st cairn.Store) (*fs.Volume, error) {
	def, err := r.Volume(ctx, name) // learns the key if this device lacks it
	if err != nil {
		return nil, err
	}
	kr, err := r.Keyring()
	if err != nil {
		return nil, err
	}
	master, err := kr.Key(def.Meta.V.ID, name)
	if err != nil {
		return nil, err
	}
	return fs.Open(r.Meta, def.Meta, master, st, fs.Options{StoreName: "spool", Workers: r.opts.Workers, Logger: r.log})
}
