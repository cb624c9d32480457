package node

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// fakeWaker records the wakes it is asked for.
type fakeWaker struct {
	mu    sync.Mutex
	asked []string // "peer>node"
}

func (f *fakeWaker) Wake(ctx context.Context, peer pki.NodeIdentity, node string) (wire.WakeReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if node == "nosuch" {
		return wire.WakeReply{}, cairn.E("wake", cairn.NotFound, node, errors.New("no such node"))
	}
	f.asked = append(f.asked, peer.Name+">"+node)
	return wire.WakeReply{Node: node, MAC: "02:00:00:00:00:01", Broadcast: "10.0.0.255", Packets: 3}, nil
}

func wakeBody(t *testing.T, v int, node string) []byte {
	b, err := wire.EncodeJSON(wire.WakeRequest{V: v, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The wake route: devices only, a request of version 1 naming a node; a
// node with no Waker answers 404.
func TestWakeRoute(t *testing.T) {
	w := &fakeWaker{}
	f := start(t, func(c *Config) { c.Waker = w })
	dev := f.client(t, f.creds(t, "laptop", pki.Device))
	rep := f.do(t, dev, http.MethodPost, wire.PathWake, wakeBody(t, 1, "desktop"), zstdHdr, wire.Zstd)
	if rep.status != http.StatusOK {
		t.Fatalf("device's wake: %d %v", rep.status, rep.err())
	}
	var wr wire.WakeReply
	if err := wire.DecodeJSON(rep.body, &wr); err != nil || wr.V != wire.WakeVersion || wr.Node != "desktop" || wr.Packets != 3 {
		t.Fatalf("reply %+v, %v", wr, err)
	}
	for _, role := range []pki.Role{pki.Benefactor, pki.Surrogate} {
		c := f.client(t, f.creds(t, "b-"+string(role), role))
		if rep := f.do(t, c, http.MethodPost, wire.PathWake, wakeBody(t, 1, "desktop"), zstdHdr, wire.Zstd); rep.status != http.StatusForbidden || !errors.Is(rep.err(), cairn.ErrPermission) {
			t.Fatalf("%s's wake: %d %v", role, rep.status, rep.err())
		}
	}
	if rep := f.do(t, f.client(t, nil), http.MethodPost, wire.PathWake, wakeBody(t, 1, "desktop"), zstdHdr, wire.Zstd); rep.status != http.StatusUnauthorized {
		t.Fatalf("anonymous wake: %d", rep.status)
	}
	if rep := f.do(t, dev, http.MethodPost, wire.PathWake, wakeBody(t, 2, "desktop"), zstdHdr, wire.Zstd); !errors.Is(rep.err(), cairn.ErrInvalid) {
		t.Fatalf("version 2: %d %v", rep.status, rep.err())
	}
	if rep := f.do(t, dev, http.MethodPost, wire.PathWake, wakeBody(t, 1, "nosuch"), zstdHdr, wire.Zstd); rep.status != http.StatusNotFound {
		t.Fatalf("no such node: %d %v", rep.status, rep.err())
	}
	if rep := f.do(t, dev, http.MethodGet, wire.PathWake, nil); rep.status != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", rep.status)
	}
	if len(w.asked) != 1 || w.asked[0] != "laptop>desktop" {
		t.Fatalf("waker asked %v", w.asked)
	}
	g := start(t, nil)
	if rep := g.do(t, g.client(t, g.creds(t, "laptop", pki.Device)), http.MethodPost, wire.PathWake, wakeBody(t, 1, "desktop"), zstdHdr, wire.Zstd); rep.status != http.StatusNotFound {
		t.Fatalf("no waker: %d", rep.status)
	}
}
