package remotestore

import (
	"net"
	"testing"
)

// ForgedAlertPeer listens on 127.0.0.1 and answers every connection's
// first bytes (a ClientHello) with a plaintext TLS alert record,
// bad_certificate, as an unauthenticated peer can; it returns its address.
func ForgedAlertPeer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				// Record type alert (21), TLS 1.2 record version, length 2:
				// level fatal (2), bad_certificate (42).
				_, _ = c.Write([]byte{21, 3, 3, 0, 2, 2, 42})
			}()
		}
	}()
	return ln.Addr().String()
}
