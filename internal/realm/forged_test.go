package realm

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/storetest"
)

// forgedAlertPeer listens on 127.0.0.1 and answers every connection's first
// bytes (a ClientHello) with a plaintext TLS alert record, bad_certificate,
// as anyone on the path or a stranger at a stale address can. It returns
// its address and the count of connections it answered.
func forgedAlertPeer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := c.Read(make([]byte, 4096)); err != nil {
					return
				}
				// Alert record (21), length 2: fatal (2), bad_certificate (42).
				_, _ = c.Write([]byte{21, 3, 3, 0, 2, 2, 42})
				n.Add(1)
			}()
		}
	}()
	return ln.Addr().String(), &n
}

// A forged TLS alert from a registrar's address does not make a benefactor
// believe it was removed: it tries the next registrar, and with none but
// the forger it keeps serving and trying. Its real removal (an answer of
// its registrar) still stops it.
func TestForgedAlertDoesNotRemoveANode(t *testing.T) {
	a, as := firstDevice(t)
	home := joinAs(t, a, pki.Benefactor, "donor")
	forged, hits := forgedAlertPeer(t)

	// The forger first, then the real registrar.
	bs := serveStandalone(t, home, StandaloneOptions{Registrars: []string{forged, as.addr}})
	waitNode(t, a.Meta, "donor", meta.NodeOnline, 30*time.Second)
	if hits.Load() == 0 {
		t.Fatal("the forger was not asked")
	}
	if err := bs.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// The forger alone: the node keeps serving through several rounds.
	hits.Store(0)
	only := serveStandalone(t, home, StandaloneOptions{Registrars: []string{forged}})
	deadline := time.Now().Add(30 * time.Second)
	for hits.Load() < 3 {
		select {
		case err := <-only.err:
			t.Fatalf("the node stopped after a forged alert: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d reports reached the forger", hits.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-only.err:
		t.Fatalf("the node stopped after forged alerts: %v", err)
	default:
	}
	if err := only.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}

	// Removed for real: stopped by its registrar's answer.
	bs = serveStandalone(t, home, StandaloneOptions{Registrars: []string{forged, as.addr}})
	waitNode(t, a.Meta, "donor", meta.NodeOnline, 30*time.Second)
	if err := a.Meta.RemoveNode(context.Background(), "donor", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := bs.wait(t, 30*time.Second); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("removed benefactor's serve returned %v", err)
	}
}

// A node at whose address a forged TLS alert answers fails the request
// with an error that is not NotFound, so the director's router counts the
// node as failed and moves on to the next node that holds the chunk
// (internal/director TestReadMovesPastFailingNodes reads past such a node
// and past one that refuses this device).
func TestForgedAlertDoesNotStopARead(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	forged, hits := forgedAlertPeer(t)
	ghost, err := a.remoteStore(ctx, "ghost", forged)
	if err != nil {
		t.Fatal(err)
	}
	defer ghost.Close()
	id, _ := storetest.Blob(9, 20000)
	_, err = ghost.Get(ctx, id)
	if err == nil || errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("get from a forged alert = %v, want a failure that is not NotFound", err)
	}
	if hits.Load() == 0 {
		t.Fatal("the ghost was not asked")
	}
}
