package dav

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"

	"cairn.dev/cairn/internal/httpauth"
)

// The users, app passwords, authentication and listener of the gateway
// are internal/httpauth's, shared with 'cairn web'; these names keep the
// gateway's API.

// Users is the list of a gateway's users.
type Users = httpauth.Users

// UserInfo is what 'cairn dav passwd ls' shows.
type UserInfo = httpauth.UserInfo

// UsersFormat is the version of the app password file (doc/format.md).
const UsersFormat = httpauth.UsersFormat

// UsersFile is where the users live in a home directory.
func UsersFile(home string) string { return httpauth.UsersFile(home) }

// OpenUsers returns the users kept in path (which need not exist yet).
func OpenUsers(path string) *Users { return httpauth.OpenUsers(path) }

// ValidUserName checks a user name.
func ValidUserName(name string) error { return httpauth.ValidUserName(name) }

// IsLoopback reports whether a listen address names only this machine.
func IsLoopback(addr string) (bool, error) { return httpauth.IsLoopback(addr) }

// TLSConfig is what the gateway's HTTPS listener presents.
func TLSConfig(cert tls.Certificate) *tls.Config { return httpauth.TLSConfig(cert) }

// Serve serves h on ln until ctx ends (httpauth.Serve).
func Serve(ctx context.Context, ln net.Listener, h http.Handler, tc *tls.Config, log *slog.Logger) error {
	return httpauth.Serve(ctx, ln, h, tc, log)
}
