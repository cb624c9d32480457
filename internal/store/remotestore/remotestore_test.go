package remotestore

import (
	"context"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/memstore"
	"cairn.dev/cairn/internal/store/storetest"
)

func TestConformanceMemstore(t *testing.T) {
	r := newRealm(t)
	storetest.Run(t, func(t *testing.T) cairn.Store {
		addr := r.serve(t, "node", memstore.New())
		return r.client(t, addr, "laptop", "node")
	})
}

func TestConformanceLocalstore(t *testing.T) {
	r := newRealm(t)
	storetest.Run(t, func(t *testing.T) cairn.Store {
		ls, err := localstore.Open(context.Background(), t.TempDir(), localstore.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		addr := r.serve(t, "node", ls)
		return r.client(t, addr, "laptop", "node")
	})
}
