package wire

import (
	"crypto/tls"
	"net"
	"net/http"
	"time"
)

// NewTransport returns the HTTP/2 transport a client of a node's listener
// uses (the registrar's heartbeat, a surrogate's client): tlsConf, short
// dial and handshake timeouts, bounded response headers, no compression
// (the bodies are sealed, so incompressible), and pings that find a dead
// connection.
func NewTransport(tlsConf *tls.Config) *http.Transport {
	var protos http.Protocols
	protos.SetHTTP2(true)
	return &http.Transport{
		TLSClientConfig:        tlsConf,
		Protocols:              &protos,
		DialContext:            (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:    5 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		DisableCompression:     true,
		IdleConnTimeout:        5 * time.Minute,
		HTTP2:                  &http.HTTP2Config{SendPingTimeout: 30 * time.Second, PingTimeout: 10 * time.Second},
	}
}
