package httpauth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

// IsLoopback reports whether a listen address ("host:port") names only
// this machine: a loopback IP or "localhost". An empty host (all
// interfaces) is not loopback.
func IsLoopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, cairn.E("listen address", cairn.Invalid, addr, errors.New("want host:port, e.g. 127.0.0.1:4918"))
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback(), nil
}

// TLSConfig is what the gateway's HTTPS listener presents: the given
// certificate chain (cairn's: a leaf signed by the realm CA, then the CA),
// TLS 1.2 or later, no client certificates (users log in with passwords).
// WebDAV clients (davfs2, file managers) speak HTTP/1.1, which is offered
// along with HTTP/2.
func TLSConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}
}

// ShutdownTimeout bounds how long Serve waits, once ctx ends, for
// requests in flight (an upload being committed) before it closes them.
var ShutdownTimeout = 2 * time.Minute

// Serve serves h on ln until ctx ends, over TLS if tc is not nil, then
// stops accepting and waits for the requests in flight (at most
// ShutdownTimeout). It returns nil after a stop asked for by ctx.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, tc *tls.Config, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         tc,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errc := make(chan error, 1)
	go func() {
		if tc != nil {
			errc <- srv.ServeTLS(ln, "", "")
		} else {
			errc <- srv.Serve(ln)
		}
	}()
	select {
	case err := <-errc:
		return cairn.E("http serve", cairn.IO, ln.Addr().String(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		return cairn.E("http serve", cairn.IO, ln.Addr().String(), fmt.Errorf("requests still running after %v: %w", ShutdownTimeout, err))
	}
	<-errc
	return nil
}
