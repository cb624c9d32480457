package httpauth

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Guard checks the HTTP Basic credentials of requests against Users,
// and locks out an address that sends too many wrong passwords. Its
// methods are safe for concurrent use.
type Guard struct {
	users   *Users
	realm   string
	hint    string
	log     *slog.Logger
	limiter limiter
}

// NewGuard returns a guard of users. realm names the service in the
// WWW-Authenticate challenge (what a client shows when it asks for a
// password); hint ends the 401 message of a request without credentials
// (how to get a password).
func NewGuard(users *Users, realm, hint string, log *slog.Logger) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{users: users, realm: realm, hint: hint, log: log}
}

// Authenticate checks HTTP Basic credentials and returns the user, or
// answers 401 (no or wrong credentials), 429 (too many wrong ones from
// this address) or 503 (the user list cannot be read) and returns "".
func (g *Guard) Authenticate(w http.ResponseWriter, r *http.Request) string {
	challenge := func(msg string) {
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Basic realm=%q, charset="UTF-8"`, g.realm))
		http.Error(w, msg, http.StatusUnauthorized)
	}
	name, pass, ok := r.BasicAuth()
	if !ok {
		challenge("authentication required: a user and app password (" + g.hint + ")")
		return ""
	}
	ip, now := clientIP(r), time.Now()
	if blocked, wait := g.limiter.blocked(ip, now); blocked {
		w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
		http.Error(w, "too many wrong passwords; try again later", http.StatusTooManyRequests)
		return ""
	}
	good, err := g.users.Verify(name, pass)
	if err != nil {
		g.log.Error("cannot check a password", "user", name, "err", err)
		http.Error(w, "cannot check passwords now", http.StatusServiceUnavailable)
		return ""
	}
	if !good {
		g.limiter.fail(ip, now)
		g.log.Info("wrong password", "service", g.realm, "user", name, "from", ip)
		if blocked, wait := g.limiter.blocked(ip, now); blocked {
			g.log.Warn("too many wrong passwords: address locked out", "service", g.realm, "from", ip, "for", wait.Round(time.Second))
		}
		challenge("wrong user or password")
		return ""
	}
	g.limiter.success(ip)
	return name
}
