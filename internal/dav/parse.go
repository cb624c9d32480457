package dav

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// The parsers of what a WebDAV request says beyond what x/net/webdav
// reads itself: the If header (RFC 4918 §10.4), Lock-Token, Timeout and
// Depth, the body of a LOCK, and a check of every XML body for empty
// namespace prefix declarations. Each refuses what it does not
// understand instead of guessing; the handler answers 400.

// ifCond is one condition of an If header list: a state token (a lock
// token, or an unknown URI such as DAV:no-lock, which matches nothing)
// or an entity tag, possibly negated.
type ifCond struct {
	Not   bool
	Token string // without the angle brackets
	ETag  string // with its quotes, as in an ETag header
}

// ifList is one parenthesised list; all its conditions must hold. Tag is
// the resource tag it applies to (a URL), empty for the request URI.
type ifList struct {
	Tag   string
	Conds []ifCond
}

// maxIfLists bounds how many lists one If header may carry.
const maxIfLists = 64

var errBadIf = errors.New("malformed If header")

// parseIf parses an If header: either lists that apply to the request
// URI, "(...) (...)", or tagged lists, "<url> (...) <url2> (...)"; the
// two forms do not mix.
func parseIf(s string) ([]ifList, error) {
	var out []ifList
	tagged := false
	tag := ""
	first := true
	sawList := true // a tag must be followed by at least one list
	for {
		s = trimLWS(s)
		if s == "" {
			break
		}
		switch s[0] {
		case '<':
			if !first && !tagged || !sawList {
				return nil, errBadIf
			}
			end := strings.IndexByte(s, '>')
			if end < 0 {
				return nil, errBadIf
			}
			tag = s[1:end]
			if tag == "" || strings.ContainsAny(tag, " \t\r\n<") {
				return nil, errBadIf
			}
			tagged, sawList = true, false
			s = s[end+1:]
		case '(':
			if tagged && tag == "" {
				return nil, errBadIf
			}
			conds, rest, err := parseIfList(s[1:])
			if err != nil {
				return nil, err
			}
			if len(out) == maxIfLists {
				return nil, errBadIf
			}
			out = append(out, ifList{Tag: tag, Conds: conds})
			sawList = true
			s = rest
		default:
			return nil, errBadIf
		}
		first = false
	}
	if len(out) == 0 || !sawList {
		return nil, errBadIf
	}
	return out, nil
}

// parseIfList reads the conditions of one list up to its ')'.
func parseIfList(s string) ([]ifCond, string, error) {
	var conds []ifCond
	for {
		s = trimLWS(s)
		if s == "" {
			return nil, "", errBadIf
		}
		if s[0] == ')' {
			if len(conds) == 0 {
				return nil, "", errBadIf
			}
			return conds, s[1:], nil
		}
		var c ifCond
		if len(s) >= 3 && strings.EqualFold(s[:3], "not") {
			c.Not = true
			s = trimLWS(s[3:])
			if s == "" {
				return nil, "", errBadIf
			}
		}
		switch s[0] {
		case '<':
			end := strings.IndexByte(s, '>')
			if end < 0 {
				return nil, "", errBadIf
			}
			c.Token = s[1:end]
			if c.Token == "" || strings.ContainsAny(c.Token, " \t\r\n<") {
				return nil, "", errBadIf
			}
			s = s[end+1:]
		case '[':
			etag, rest, err := parseBracketETag(s[1:])
			if err != nil {
				return nil, "", err
			}
			c.ETag, s = etag, rest
		default:
			return nil, "", errBadIf
		}
		conds = append(conds, c)
	}
}

// parseBracketETag reads an entity tag (W/"..." or "...") and the ']'
// after it.
func parseBracketETag(s string) (string, string, error) {
	s = trimLWS(s)
	i := 0
	if strings.HasPrefix(s, "W/") {
		i = 2
	}
	if i >= len(s) || s[i] != '"' {
		return "", "", errBadIf
	}
	end := strings.IndexByte(s[i+1:], '"')
	if end < 0 {
		return "", "", errBadIf
	}
	end += i + 2 // past the closing quote
	etag := s[:end]
	rest := trimLWS(s[end:])
	if rest == "" || rest[0] != ']' {
		return "", "", errBadIf
	}
	return etag, rest[1:], nil
}

func trimLWS(s string) string { return strings.TrimLeft(s, " \t\r\n") }

// ifTokens returns every state token the lists name without Not: the lock
// tokens the request submits.
func ifTokens(lists []ifList) []string {
	var out []string
	for _, l := range lists {
		for _, c := range l.Conds {
			if c.Token != "" && !c.Not {
				out = append(out, c.Token)
			}
		}
	}
	return out
}

// renderIf writes lists back as an If header (the fuzz test's round trip).
func renderIf(lists []ifList) string {
	var b strings.Builder
	for i, l := range lists {
		if l.Tag != "" && (i == 0 || lists[i-1].Tag != l.Tag) {
			fmt.Fprintf(&b, "<%s> ", l.Tag)
		}
		b.WriteByte('(')
		for j, c := range l.Conds {
			if j > 0 {
				b.WriteByte(' ')
			}
			if c.Not {
				b.WriteString("Not ")
			}
			if c.Token != "" {
				fmt.Fprintf(&b, "<%s>", c.Token)
			} else {
				fmt.Fprintf(&b, "[%s]", c.ETag)
			}
		}
		b.WriteString(") ")
	}
	return strings.TrimSpace(b.String())
}

// parseLockToken reads a Lock-Token header: one Coded-URL, "<token>".
func parseLockToken(s string) (string, error) {
	s = strings.TrimSpace(s)
	if len(s) < 3 || s[0] != '<' || s[len(s)-1] != '>' {
		return "", errors.New("malformed Lock-Token header: want <token>")
	}
	tok := s[1 : len(s)-1]
	if strings.ContainsAny(tok, " \t\r\n<>") {
		return "", errors.New("malformed Lock-Token header: want <token>")
	}
	return tok, nil
}

// Lock timeouts: what a LOCK without a Timeout header gets, and the most
// any lock gets ("Infinite" included): locks live in this process's
// memory, and one a client forgot must not block a file for long.
const (
	DefaultLockTimeout = time.Hour
	MaxLockTimeout     = 24 * time.Hour
)

// parseTimeout reads a Timeout header ("Second-3600", "Infinite", or a
// comma-separated list of preferences: the first one understood wins),
// bounded by MaxLockTimeout. An empty header gives DefaultLockTimeout.
func parseTimeout(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return DefaultLockTimeout, nil
	}
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if strings.EqualFold(p, "Infinite") {
			return MaxLockTimeout, nil
		}
		if len(p) > 7 && strings.EqualFold(p[:7], "Second-") {
			n, err := strconv.ParseUint(p[7:], 10, 64)
			if err != nil {
				continue
			}
			if n == 0 {
				n = 1
			}
			if n > uint64(MaxLockTimeout/time.Second) {
				return MaxLockTimeout, nil
			}
			return time.Duration(n) * time.Second, nil
		}
	}
	return 0, errors.New("malformed Timeout header: want Second-N or Infinite")
}

// Depth values.
const (
	depthZero     = 0
	depthOne      = 1
	depthInfinity = -1
)

// parseDepth reads a Depth header; an empty one gives def.
func parseDepth(s string, def int) (int, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "":
		return def, nil
	case "0":
		return depthZero, nil
	case "1":
		return depthOne, nil
	case "infinity":
		return depthInfinity, nil
	}
	return 0, errors.New("malformed Depth header: want 0, 1 or infinity")
}

// checkXMLBody refuses an XML request body that is not well formed or
// declares a namespace prefix bound to the empty string (xmlns:p=""),
// which the XML Namespaces recommendation forbids (litmus's
// propfind_invalid2). A default namespace undeclared with xmlns="" is
// fine. An empty body passes.
func checkXMLBody(body []byte) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	d := xml.NewDecoder(bytes.NewReader(body))
	depth, roots := 0, 0
	for {
		tok, err := d.RawToken()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("request body is not well-formed XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
			}
			depth++
			for _, a := range t.Attr {
				if a.Name.Space == "xmlns" && a.Value == "" {
					return fmt.Errorf("request body binds namespace prefix %q to the empty string", a.Name.Local)
				}
			}
		case xml.EndElement:
			depth--
		case xml.CharData:
			if depth == 0 && len(bytes.TrimSpace(t)) > 0 {
				return errors.New("request body has text outside its root element")
			}
		}
	}
	if depth != 0 || roots != 1 {
		return errors.New("request body must hold exactly one XML element")
	}
	return nil
}

// lockRequest is what the body of a LOCK asks for.
type lockRequest struct {
	Shared bool
	Owner  string // the inner XML of DAV:owner, verbatim ("" if none)
}

var errUnsupportedLock = errors.New("only write locks are supported")

// parseLockInfo reads a DAV:lockinfo body: a lockscope (exclusive or
// shared), a locktype (write: the only one RFC 4918 defines) and an
// optional owner. Unknown elements are ignored, as RFC 4918 §17 asks.
func parseLockInfo(body []byte) (lockRequest, error) {
	var lr lockRequest
	if err := checkXMLBody(body); err != nil {
		return lr, err
	}
	d := xml.NewDecoder(bytes.NewReader(body))
	root, err := nextStart(d)
	if err != nil {
		return lr, err
	}
	if root.Name != (xml.Name{Space: "DAV:", Local: "lockinfo"}) {
		return lr, fmt.Errorf("LOCK body: want DAV:lockinfo, have %s", fmtName(root.Name))
	}
	scopes, types := 0, 0
	write := false
	for {
		tok, err := d.Token()
		if err != nil {
			return lr, fmt.Errorf("LOCK body: %w", err)
		}
		switch t := tok.(type) {
		case xml.EndElement: // of lockinfo
			switch {
			case scopes != 1:
				return lr, errors.New("LOCK body: want one lockscope, exclusive or shared")
			case types != 1:
				return lr, errors.New("LOCK body: want one locktype")
			case !write:
				return lr, errUnsupportedLock
			}
			return lr, nil
		case xml.StartElement:
			if t.Name.Space != "DAV:" {
				if err := d.Skip(); err != nil {
					return lr, err
				}
				continue
			}
			switch t.Name.Local {
			case "lockscope":
				names, err := childNames(d)
				if err != nil {
					return lr, err
				}
				for _, n := range names {
					switch n {
					case xml.Name{Space: "DAV:", Local: "exclusive"}:
						scopes++
					case xml.Name{Space: "DAV:", Local: "shared"}:
						scopes++
						lr.Shared = true
					}
				}
			case "locktype":
				names, err := childNames(d)
				if err != nil {
					return lr, err
				}
				for _, n := range names {
					types++
					write = write || n == xml.Name{Space: "DAV:", Local: "write"}
				}
			case "owner":
				start := d.InputOffset()
				end, err := skipTo(d)
				if err != nil {
					return lr, err
				}
				lr.Owner = strings.TrimSpace(string(body[start:end]))
			default:
				if err := d.Skip(); err != nil {
					return lr, err
				}
			}
		}
	}
}

// nextStart returns the first start element.
func nextStart(d *xml.Decoder) (xml.StartElement, error) {
	for {
		tok, err := d.Token()
		if err != nil {
			return xml.StartElement{}, fmt.Errorf("request body: %w", err)
		}
		if t, ok := tok.(xml.StartElement); ok {
			return t, nil
		}
	}
}

// childNames reads the children of the element just started, to its end,
// and returns their names.
func childNames(d *xml.Decoder) ([]xml.Name, error) {
	var names []xml.Name
	for {
		tok, err := d.Token()
		if err != nil {
			return nil, err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			names = append(names, t.Name)
			if err := d.Skip(); err != nil {
				return nil, err
			}
		case xml.EndElement:
			return names, nil
		}
	}
}

// skipTo consumes the rest of the element just started and returns the
// input offset where its end tag begins.
func skipTo(d *xml.Decoder) (int64, error) {
	depth := 0
	for {
		off := d.InputOffset()
		tok, err := d.Token()
		if err != nil {
			return 0, err
		}
		switch tok.(type) {
		case xml.StartElement:
			depth++
		case xml.EndElement:
			if depth == 0 {
				return off, nil
			}
			depth--
		}
	}
}

func fmtName(n xml.Name) string {
	if n.Space == "" {
		return n.Local
	}
	return "{" + n.Space + "}" + n.Local
}
