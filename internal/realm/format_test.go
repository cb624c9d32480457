package realm

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
)

// TestOpenRefusesNewerRecordFormat: a realm whose record says a metadata
// format newer than this binary's is refused at open, with an error that
// says to upgrade; one at this binary's format opens.
func TestOpenRefusesNewerRecordFormat(t *testing.T) {
	ctx := context.Background()
	ep := etcdtest.New(t).Endpoints()
	home := t.TempDir()
	r, err := Init(ctx, home, Options{Etcd: ep, NoPassphrase: true, NodeName: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err = r.Meta.UseFormat(ctx, meta.RecordFormat); err != nil {
		t.Fatal(err)
	}
	info, err := r.Meta.Realm(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	r, err = Open(ctx, home, Options{NoPassphrase: true})
	if err != nil {
		t.Fatalf("open at format %d: %v", meta.RecordFormat, err)
	}
	info.Format = meta.RecordFormat + 1
	b, _ := json.Marshal(info)
	if _, err = r.Meta.Client().Put(ctx, "/cairn/v1/realm", string(b)); err != nil {
		t.Fatal(err)
	}
	r.Close()
	_, err = Open(ctx, home, Options{NoPassphrase: true})
	if !errors.Is(err, cairn.ErrInvalid) || !strings.Contains(err.Error(), "upgrade cairn") {
		t.Fatalf("open of a realm at format %d: %v, want Invalid saying to upgrade", info.Format, err)
	}
}
