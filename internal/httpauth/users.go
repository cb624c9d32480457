// Package httpauth is what cairn's HTTP services (the WebDAV gateway,
// the web page) share: the users and app passwords of a device, HTTP
// Basic authentication with a lockout of password guessing, the loopback
// rule of plain HTTP, and the TLS listener.
package httpauth

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/sys/unix"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// App passwords. Who may use a gateway is a list of users, each with a
// random password cairn makes ('cairn dav passwd add'), shown once and
// stored only as an Argon2id hash, in a file of the device's $CAIRN_HOME
// (UsersFile; doc/format.md, "WebDAV app passwords"). A gateway reads it
// again whenever it changes, so adding or removing a user needs no
// restart. A password verified once is remembered (an HMAC of it under a
// key of this process) for verifyCache, so that a client sending it with
// every request does not pay an Argon2id hash each time.

// UsersFile is where the users live in a home directory.
func UsersFile(home string) string { return filepath.Join(home, "dav", "passwd.json") }

// Argon2id parameters of new hashes (OWASP's second recommendation: 19 MiB,
// two passes, one lane: ~40 ms here). The parameters are stored with each
// hash, so they can change without invalidating old ones.
const (
	argonTime    = 2
	argonMemory  = 19 << 10 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// UsersFormat is the version of the app password file (doc/format.md).
const UsersFormat = usersFormat

const (
	usersFormat = 1
	verifyCache = 10 * time.Minute
	// maxHashers bounds the Argon2id hashes computed at once (each takes
	// 19 MiB): a burst of bad logins must not exhaust memory.
	maxHashers = 2
)

// UserInfo is what 'cairn dav passwd ls' shows.
type UserInfo struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

type userRecord struct {
	Name    string    `json:"name"`
	Hash    string    `json:"hash"`
	Created time.Time `json:"created"`
}

type usersFileJSON struct {
	Format int          `json:"format"`
	Users  []userRecord `json:"users"`
}

// Users is the list of a gateway's users. Its methods are safe for
// concurrent use.
type Users struct {
	path string

	mu     sync.Mutex
	stamp  string // size, mtime and inode of the file last read
	users  map[string]userRecord
	cache  map[string]verified
	key    [32]byte
	hasher chan struct{}
	dummy  string // a hash to check unknown users against, for even timing
}

type verified struct {
	hash    string // the record it was verified against
	mac     [32]byte
	expires time.Time
}

// OpenUsers returns the users kept in path (which need not exist yet).
func OpenUsers(path string) *Users {
	u := &Users{path: path, cache: map[string]verified{}, hasher: make(chan struct{}, maxHashers)}
	rand.Read(u.key[:])
	return u
}

// ValidUserName checks a user name: 1 to 64 of letters, digits and
// . _ @ - (no ':', which HTTP Basic authentication cannot carry).
func ValidUserName(name string) error {
	if name == "" || len(name) > 64 {
		return cairn.E("user name", cairn.Invalid, name, errors.New("want 1 to 64 characters"))
	}
	for _, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._@-", c)
		if !ok {
			return cairn.E("user name", cairn.Invalid, name, errors.New("use letters, digits, '.', '_', '@' and '-'"))
		}
	}
	return nil
}

func fileStamp(fi os.FileInfo) string {
	ino := uint64(0)
	if st, ok := fi.Sys().(*unix.Stat_t); ok {
		ino = st.Ino
	}
	return fmt.Sprintf("%d %d %d", fi.Size(), fi.ModTime().UnixNano(), ino)
}

// read loads the file (absent: no users).
func readUsers(path string) (map[string]userRecord, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]userRecord{}, nil
	}
	if err != nil {
		return nil, cairn.E("read users", cairn.IO, path, err)
	}
	var f usersFileJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, cairn.E("read users", cairn.Corrupt, path, err)
	}
	if f.Format != usersFormat {
		return nil, cairn.E("read users", cairn.Corrupt, path, fmt.Errorf("format %d, want %d", f.Format, usersFormat))
	}
	m := make(map[string]userRecord, len(f.Users))
	for _, r := range f.Users {
		m[r.Name] = r
	}
	return m, nil
}

// load reads the file again if it changed since it was last read.
func (u *Users) loadLocked() error {
	fi, err := os.Stat(u.path)
	stamp := "absent"
	if err == nil {
		stamp = fileStamp(fi)
	} else if !errors.Is(err, os.ErrNotExist) {
		return cairn.E("read users", cairn.IO, u.path, err)
	}
	if u.users != nil && stamp == u.stamp {
		return nil
	}
	m, err := readUsers(u.path)
	if err != nil {
		return err
	}
	u.users, u.stamp = m, stamp
	return nil
}

// update changes the file under an exclusive lock (flock of a lock file
// beside it: two 'cairn dav passwd' at once lose nothing) and writes it
// atomically (temp file, fsync, rename), mode 0600.
func (u *Users) update(fn func(m map[string]userRecord) error) error {
	const op = "update users"
	dir := filepath.Dir(u.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cairn.E(op, cairn.IO, dir, err)
	}
	lf, err := os.OpenFile(u.path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return cairn.E(op, cairn.IO, u.path, err)
	}
	defer lf.Close()
	if err = unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return cairn.E(op, cairn.IO, u.path, err)
	}
	defer unix.Flock(int(lf.Fd()), unix.LOCK_UN)
	m, err := readUsers(u.path)
	if err != nil {
		return err
	}
	if err = fn(m); err != nil {
		return err
	}
	f := usersFileJSON{Format: usersFormat}
	for _, r := range m {
		f.Users = append(f.Users, r)
	}
	sort.Slice(f.Users, func(i, j int) bool { return f.Users[i].Name < f.Users[j].Name })
	b, _ := json.MarshalIndent(f, "", "  ")
	return durable.ReplaceFile(u.path, append(b, '\n'), 0o600)
}

// Add makes a user with a new random app password and returns it: the
// only time it is ever seen. An existing user is an Exist error unless
// replace, which gives the user a new password (the old one stops working).
func (u *Users) Add(name string, replace bool) (string, error) {
	if err := ValidUserName(name); err != nil {
		return "", err
	}
	var raw [16]byte
	rand.Read(raw[:])
	pass := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw[:]))
	hash := hashPassword(pass)
	err := u.update(func(m map[string]userRecord) error {
		if _, ok := m[name]; ok && !replace {
			return cairn.E("add user", cairn.Exist, name, errors.New("the user exists: --replace gives it a new password"))
		}
		m[name] = userRecord{Name: name, Hash: hash, Created: time.Now().UTC().Truncate(time.Second)}
		return nil
	})
	if err != nil {
		return "", err
	}
	return pass, nil
}

// Remove deletes a user: its password stops working at once on every
// gateway of this home.
func (u *Users) Remove(name string) error {
	return u.update(func(m map[string]userRecord) error {
		if _, ok := m[name]; !ok {
			return cairn.E("remove user", cairn.NotFound, name, errors.New("no such WebDAV user"))
		}
		delete(m, name)
		return nil
	})
}

// List returns the users, by name.
func (u *Users) List() ([]UserInfo, error) {
	m, err := readUsers(u.path)
	if err != nil {
		return nil, err
	}
	out := make([]UserInfo, 0, len(m))
	for _, r := range m {
		out = append(out, UserInfo{Name: r.Name, Created: r.Created})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Verify reports whether password is user name's. An unknown user costs
// the same hash as a known one.
func (u *Users) Verify(name, password string) (bool, error) {
	mac := u.mac(name, password)
	u.mu.Lock()
	if err := u.loadLocked(); err != nil {
		u.mu.Unlock()
		return false, err
	}
	rec, known := u.users[name]
	if c, ok := u.cache[name]; ok && known && c.hash == rec.Hash && time.Now().Before(c.expires) && hmac.Equal(c.mac[:], mac[:]) {
		u.mu.Unlock()
		return true, nil
	}
	if u.dummy == "" {
		u.dummy = hashPassword("cairn: no such user")
	}
	hash := u.dummy
	if known {
		hash = rec.Hash
	}
	u.mu.Unlock()

	u.hasher <- struct{}{}
	ok, err := checkPassword(hash, password)
	<-u.hasher
	if err != nil {
		return false, cairn.E("verify password", cairn.Corrupt, u.path, fmt.Errorf("user %s: %w", name, err))
	}
	if !ok || !known {
		return false, nil
	}
	u.mu.Lock()
	u.cache[name] = verified{hash: rec.Hash, mac: mac, expires: time.Now().Add(verifyCache)}
	u.mu.Unlock()
	return true, nil
}

func (u *Users) mac(name, password string) [32]byte {
	h := hmac.New(sha256.New, u.key[:])
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(password))
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// Count returns how many users there are.
func (u *Users) Count() (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.loadLocked(); err != nil {
		return 0, err
	}
	return len(u.users), nil
}

// hashPassword returns the PHC string of a new Argon2id hash:
// $argon2id$v=19$m=KiB,t=passes,p=lanes$salt$key (unpadded base64).
func hashPassword(pass string) string {
	salt := make([]byte, argonSaltLen)
	rand.Read(salt)
	key := argon2.IDKey([]byte(pass), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	b64 := base64.RawStdEncoding
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		b64.EncodeToString(salt), b64.EncodeToString(key))
}

// checkPassword compares pass with a PHC Argon2id hash in constant time.
// Parameters out of sane bounds (a damaged or hostile file) are refused
// rather than computed.
func checkPassword(hash, pass string) (bool, error) {
	f := strings.Split(hash, "$")
	if len(f) != 6 || f[0] != "" || f[1] != "argon2id" || f[2] != "v="+strconv.Itoa(argon2.Version) {
		return false, errors.New("not an argon2id hash of version 19")
	}
	var m, t, p uint32
	if _, err := fmt.Sscanf(f[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return false, fmt.Errorf("hash parameters: %w", err)
	}
	if m < 8 || m > 1<<20 || t < 1 || t > 16 || p < 1 || p > 16 {
		return false, fmt.Errorf("hash parameters out of bounds: m=%d t=%d p=%d", m, t, p)
	}
	b64 := base64.RawStdEncoding
	salt, err := b64.DecodeString(f[4])
	if err != nil || len(salt) < 8 || len(salt) > 64 {
		return false, errors.New("bad salt")
	}
	want, err := b64.DecodeString(f[5])
	if err != nil || len(want) < 16 || len(want) > 64 {
		return false, errors.New("bad key")
	}
	got := argon2.IDKey([]byte(pass), salt, t, m, uint8(p), uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// limiter slows password guessing: a client address that sent maxFails
// wrong passwords within failWindow is refused (429) until the window
// ends. Requests without credentials do not count (every client's first
// request has none).
type limiter struct {
	mu sync.Mutex
	m  map[string]*failures
}

type failures struct {
	n     int
	reset time.Time
}

const (
	maxFails   = 10
	failWindow = time.Minute
)

func clientIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// blocked reports whether ip must wait, and how long.
func (l *limiter) blocked(ip string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.m[ip]
	if f == nil || now.After(f.reset) || f.n < maxFails {
		return false, 0
	}
	return true, f.reset.Sub(now)
}

func (l *limiter) fail(ip string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string]*failures{}
	}
	if len(l.m) > 10000 {
		for k, f := range l.m {
			if now.After(f.reset) {
				delete(l.m, k)
			}
		}
	}
	f := l.m[ip]
	if f == nil || now.After(f.reset) {
		f = &failures{reset: now.Add(failWindow)}
		l.m[ip] = f
	}
	f.n++
}

func (l *limiter) success(ip string) {
	l.mu.Lock()
	delete(l.m, ip)
	l.mu.Unlock()
}
