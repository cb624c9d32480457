package etcdtest

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// CutProxy forwards connections to an etcd endpoint (TCP or unix) until
// Cut: then it drops every connection, open or new, until Restore (a
// device whose link to the metadata service is gone).
type CutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

// NewCutProxy starts a proxy of endpoint on 127.0.0.1, closed at cleanup.
func NewCutProxy(t testing.TB, endpoint string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &CutProxy{ln: ln, target: strings.TrimPrefix(strings.TrimPrefix(endpoint, "http://"), "https://"), conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.Cut() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			network, addr := "tcp", p.target
			if a, ok := strings.CutPrefix(p.target, "unix://"); ok {
				network, addr = "unix", a
			}
			u, err := net.Dial(network, addr)
			if err != nil {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close(); c.Close() }()
			go func() { io.Copy(c, u); u.Close(); c.Close() }()
		}
	}()
	return p
}

// Endpoint is the proxy's address, for a client.
func (p *CutProxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// Cut drops every connection and refuses new ones.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

// Restore lets new connections through again.
func (p *CutProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
