package etcdsvc

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

func TestConnectExternal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := StartEmbedded(ctx, t.TempDir(), Options{NoFsync: true, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The first endpoint is dead: one live member is enough.
	dead := deadAddr(t)
	conn, err := ConnectExternal(ctx, []string{dead, "http://" + s.Endpoint()}, ConnectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Client().Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	if got := conn.Endpoints(); len(got) != 2 || got[0] != dead {
		t.Errorf("Endpoints() = %v", got)
	}
}

func TestConnectExternalDead(t *testing.T) {
	a, b := deadAddr(t), deadAddr(t)
	t0 := time.Now()
	_, err := ConnectExternal(context.Background(), []string{a, b}, ConnectOptions{})
	d := time.Since(t0)
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if !strings.Contains(err.Error(), a+","+b) {
		t.Errorf("error does not name the endpoints: %v", err)
	}
	if d > 2*time.Second {
		t.Errorf("refused connections took %v to report", d)
	}
	t.Logf("%v (after %v)", err, d)
}

// A port that accepts TCP but never speaks gRPC (a hung or wrong server)
// is reported after DialTimeout, not hung on.
func TestConnectExternalHung(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, aerr := l.Accept()
			if aerr != nil {
				return
			}
			defer c.Close()
		}
	}()
	t0 := time.Now()
	_, err = ConnectExternal(context.Background(), []string{l.Addr().String()}, ConnectOptions{DialTimeout: 500 * time.Millisecond})
	d := time.Since(t0)
	if !errors.Is(err, cairn.ErrUnavailable) {
		t.Fatalf("got %v, want Unavailable", err)
	}
	if d > 3*time.Second {
		t.Errorf("hung server took %v to report", d)
	}
	t.Logf("%v (after %v)", err, d)
}

func TestConnectExternalArgs(t *testing.T) {
	_, err := ConnectExternal(context.Background(), nil, ConnectOptions{})
	if !errors.Is(err, cairn.ErrInvalid) {
		t.Errorf("no endpoints: %v, want Invalid", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = ConnectExternal(ctx, []string{deadAddr(t)}, ConnectOptions{})
	if !errors.Is(err, cairn.ErrCanceled) {
		t.Errorf("canceled: %v, want Canceled", err)
	}
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// With TLS, an http:// endpoint is refused (etcd's client would talk
// cleartext to it), and a server that does not speak TLS is Unavailable,
// reported at once. (Connecting through TLS, and refusals of certificates,
// are tested against the metadata gateway, internal/metagw.)
func TestConnectExternalTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conf := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	for _, ep := range []string{"http://127.0.0.1:2379", "unix://x", "HTTP://127.0.0.1:2379"} {
		if _, err := ConnectExternal(ctx, []string{ep}, ConnectOptions{TLS: conf}); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("%s with TLS: %v, want Invalid", ep, err)
		}
	}
	s, err := StartEmbedded(ctx, t.TempDir(), Options{NoFsync: true, Loopback: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Now()
	_, err = ConnectExternal(ctx, []string{"https://" + s.Endpoint()}, ConnectOptions{TLS: conf})
	if !errors.Is(err, cairn.ErrUnavailable) || errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("TLS to a cleartext etcd: %v, want Unavailable", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("took %v to report", d)
	}
	t.Logf("%v", err)
}
