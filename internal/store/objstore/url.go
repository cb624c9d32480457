package objstore

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"cairn.dev/cairn/internal/cairn"
)

// URL is a parsed cloud store URL, SCHEME://BUCKET/PREFIX?PARAMS.
type URL struct {
	Scheme string     // "s3", "gs", "azblob"
	Bucket string     // bucket or container
	Prefix string     // without leading or trailing "/"; "" for the whole bucket
	Query  url.Values // parameters, each with exactly one value
}

// MaxPrefix is the longest prefix accepted, in bytes.
const MaxPrefix = 512

// ParseURL parses raw as a URL of scheme whose query may hold only the
// parameters named in params, each at most once. The bucket is 1 to 222
// characters of a-z, 0-9, '.', '-' and '_' (each backend checks its
// provider's stricter rules); the prefix is '/'-separated segments, none
// empty, "." or "..", of valid UTF-8 without control characters. A URL
// holding credentials (user:password@) is refused: credentials come from
// the environment.
func ParseURL(raw, scheme string, params ...string) (URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// Not the URL itself: it may hold a secret.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return URL{}, cairn.E("parse store URL", cairn.Invalid, "", err)
	}
	// What errors may show: no credentials, and no query (an unknown
	// parameter may be a secret, e.g. a SAS signature); errors name the
	// offending parameter's key only.
	v := *u
	v.User, v.RawQuery, v.ForceQuery = nil, "", false
	safe := v.String()
	bad := func(format string, a ...any) (URL, error) {
		return URL{}, cairn.E("parse store URL", cairn.Invalid, safe, fmt.Errorf(format, a...))
	}
	switch {
	case !strings.EqualFold(u.Scheme, scheme):
		return bad("want a %s:// URL", scheme)
	case u.Opaque != "":
		return bad("want %s://BUCKET/PREFIX", scheme)
	case u.User != nil:
		return bad("credentials do not belong in the URL: they are read from the environment")
	case u.Fragment != "" || u.RawFragment != "" || strings.Contains(raw, "#"):
		return bad("a store URL has no #fragment")
	}
	out := URL{Scheme: scheme, Bucket: u.Host}
	if err = checkBucket(out.Bucket); err != nil {
		return bad("bucket %q: %v", out.Bucket, err)
	}
	out.Prefix = strings.Trim(u.Path, "/")
	if err = checkPrefix(out.Prefix); err != nil {
		return bad("prefix %q: %v", out.Prefix, err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("the query does not parse (its text is not shown: it may hold credentials)")
	}
	for k, v := range q {
		if !slices.Contains(params, k) {
			if len(params) == 0 {
				return bad("unknown parameter %q (%s:// takes none)", k, scheme)
			}
			return bad("unknown parameter %q (known: %s)", k, strings.Join(params, ", "))
		}
		if len(v) != 1 {
			return bad("parameter %q given %d times", k, len(v))
		}
	}
	out.Query = q
	return out, nil
}

func checkBucket(b string) error {
	if b == "" {
		return errors.New("missing")
	}
	if len(b) > 222 {
		return fmt.Errorf("%d characters, at most 222", len(b))
	}
	for _, c := range []byte(b) {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("character %q: want a-z, 0-9, '.', '-', '_'", c)
		}
	}
	return nil
}

func checkPrefix(p string) error {
	if len(p) > MaxPrefix {
		return fmt.Errorf("%d bytes, at most %d", len(p), MaxPrefix)
	}
	if p == "" {
		return nil
	}
	if !utf8.ValidString(p) {
		return errors.New("not valid UTF-8")
	}
	for _, seg := range strings.Split(p, "/") {
		switch seg {
		case "":
			return errors.New("empty segment")
		case ".", "..":
			return fmt.Errorf("segment %q", seg)
		}
		for _, r := range seg {
			if r < 0x20 || r == 0x7f || r == utf8.RuneError || r >= 0x80 && r < 0xa0 {
				return fmt.Errorf("control character %U", r)
			}
		}
	}
	return nil
}

// Get returns the value of parameter k, or "".
func (u URL) Get(k string) string { return u.Query.Get(k) }

// String returns the URL in canonical form: ParseURL of it gives u back.
func (u URL) String() string {
	v := url.URL{Scheme: u.Scheme, Host: u.Bucket, RawQuery: u.Query.Encode()}
	if u.Prefix != "" {
		v.Path = "/" + u.Prefix
	}
	return v.String()
}

// Bool parses a boolean parameter: "", "0", "false" are false; "1",
// "true" are true.
func (u URL) Bool(k string) (bool, error) {
	switch u.Query.Get(k) {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	}
	return false, cairn.E("parse store URL", cairn.Invalid, u.String(), fmt.Errorf("parameter %s=%q: want 0 or 1", k, u.Query.Get(k)))
}
