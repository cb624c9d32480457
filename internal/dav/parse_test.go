package dav

import (
	"bytes"
	"encoding/xml"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/webdav"
)

func TestParseIf(t *testing.T) {
	good := map[string][]ifList{
		`(<urn:uuid:1>)`: {{Conds: []ifCond{{Token: "urn:uuid:1"}}}},
		`(<urn:uuid:1> ["e1"]) (Not <DAV:no-lock> [W/"e2"])`: {
			{Conds: []ifCond{{Token: "urn:uuid:1"}, {ETag: `"e1"`}}},
			{Conds: []ifCond{{Not: true, Token: "DAV:no-lock"}, {ETag: `W/"e2"`}}},
		},
		` <http://h/a> (<t1>) (<t2>)  </b> ( not [ "x]y" ] ) `: {
			{Tag: "http://h/a", Conds: []ifCond{{Token: "t1"}}},
			{Tag: "http://h/a", Conds: []ifCond{{Token: "t2"}}},
			{Tag: "/b", Conds: []ifCond{{Not: true, ETag: `"x]y"`}}},
		},
	}
	for in, want := range good {
		got, err := parseIf(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("parseIf(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{``, `()`, `(<>)`, `<http://h/a>`, `(<t>) <http://h/a> (<t>)`, `<a> <b> (<t>)`,
		`(<t>`, `(Not)`, `([noquote])`, `(["e"`, `(<t>) x`, `(Nope <t>)`, `<a b> (<t>)`} {
		if got, err := parseIf(in); err == nil {
			t.Errorf("parseIf(%q) = %+v, want an error", in, got)
		}
	}
	lists, _ := parseIf(`(<a> Not <b> ["e"]) (<c>)`)
	if got := ifTokens(lists); !reflect.DeepEqual(got, []string{"a", "c"}) {
		t.Errorf("ifTokens = %v, want [a c] (negated tokens are not submitted)", got)
	}
}

func TestParseHeaders(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"": DefaultLockTimeout, "Second-3600": time.Hour, "Infinite": MaxLockTimeout,
		"second-0": time.Second, "Second-99999999999": MaxLockTimeout, "Bogus, Second-5": 5 * time.Second,
		"Infinite, Second-5": MaxLockTimeout,
	} {
		got, err := parseTimeout(in)
		if err != nil || got != want {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"Second-", "Second--1", "Minute-3", "Second-x"} {
		if _, err := parseTimeout(in); err == nil {
			t.Errorf("parseTimeout(%q) accepted", in)
		}
	}
	if tok, err := parseLockToken(" <urn:uuid:x> "); err != nil || tok != "urn:uuid:x" {
		t.Errorf("parseLockToken = %q, %v", tok, err)
	}
	for _, in := range []string{"", "<>", "urn:uuid:x", "<a b>", "<a><b>"} {
		if _, err := parseLockToken(in); err == nil {
			t.Errorf("parseLockToken(%q) accepted", in)
		}
	}
	for in, want := range map[string]int{"": 7, "0": 0, "1": 1, "Infinity": depthInfinity} {
		if got, err := parseDepth(in, 7); err != nil || got != want {
			t.Errorf("parseDepth(%q) = %d, %v", in, got, err)
		}
	}
	if _, err := parseDepth("2", 0); err == nil {
		t.Error("parseDepth(2) accepted")
	}
}

func TestCheckXMLBody(t *testing.T) {
	for _, ok := range []string{"", "  \n", `<a xmlns="urn:x"><b xmlns=""/></a>`, `<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>`} {
		if err := checkXMLBody([]byte(ok)); err != nil {
			t.Errorf("checkXMLBody(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{`<a xmlns:ns1=""/>`, `<a><b xmlns:p=""/></a>`, `<a>`, `<a/><b/>`, `text`, `<a/>x`} {
		if err := checkXMLBody([]byte(bad)); err == nil {
			t.Errorf("checkXMLBody(%q) accepted", bad)
		}
	}
}

func TestParseLockInfo(t *testing.T) {
	body := `<?xml version="1.0"?><lockinfo xmlns="DAV:" xmlns:x="urn:x"><x:ignored>?</x:ignored><lockscope><shared/></lockscope>` +
		`<locktype><write/></locktype><owner><href>mailto:a@b</href> &amp; more</owner></lockinfo>`
	lr, err := parseLockInfo([]byte(body))
	if err != nil || !lr.Shared || lr.Owner != `<href>mailto:a@b</href> &amp; more` {
		t.Fatalf("parseLockInfo = %+v, %v", lr, err)
	}
	lr, err = parseLockInfo([]byte(`<D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype><D:owner/></D:lockinfo>`))
	if err != nil || lr.Shared || lr.Owner != "" {
		t.Fatalf("parseLockInfo (exclusive, empty owner) = %+v, %v", lr, err)
	}
	for _, bad := range []string{
		`<lockinfo xmlns="DAV:"><locktype><write/></locktype></lockinfo>`,
		`<lockinfo xmlns="DAV:"><lockscope><exclusive/><shared/></lockscope><locktype><write/></locktype></lockinfo>`,
		`<lockinfo xmlns="urn:other"><lockscope><exclusive/></lockscope><locktype><write/></locktype></lockinfo>`,
		`<lockinfo xmlns="DAV:"><lockscope><exclusive/></lockscope></lockinfo>`,
		`<lockinfo xmlns="DAV:"><lockscope><exclusive/></lockscope><locktype><read/></locktype></lockinfo>`,
		`<lockinfo xmlns="DAV:"><lockscope><exclusive/></lockscope>`,
	} {
		if lr, err := parseLockInfo([]byte(bad)); err == nil {
			t.Errorf("parseLockInfo(%q) = %+v, want an error", bad, lr)
		}
	}
}

// TestLockManager: conflicts, scope, expiry (on a fake clock).
func TestLockManager(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newLockManager()
	m.now = func() time.Time { return now }
	a, err := m.create("/a", false, false, "", time.Minute, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		root           string
		shared, depth0 bool
	}{{"/a", true, true}, {"/a/b", false, true}, {"/", false, false}, {"/", true, false}} {
		if _, err := m.create(c.root, c.shared, c.depth0, "", time.Minute, false); err != webdav.ErrLocked {
			t.Errorf("lock %+v under an exclusive infinite lock on /a: %v, want ErrLocked", c, err)
		}
	}
	if _, err := m.create("/ab", false, true, "", time.Minute, false); err != nil {
		t.Errorf("/ab is not below /a: %v", err)
	}
	if _, err := m.create("/", false, true, "", time.Minute, false); err != nil {
		t.Errorf("a depth-0 lock on / does not conflict with /a: %v", err)
	}
	if !m.allowedLocked([]target{{"/a/b/c", false}}, []string{a.token}) || m.allowedLocked([]target{{"/a/b/c", false}}, nil) {
		t.Error("allowed: /a's token must unlock /a/b/c, no token must not")
	}
	if err := m.unlock(a.token, "/elsewhere"); err != errLockMismatch {
		t.Errorf("unlock outside the lock's scope: %v", err)
	}
	if _, err := m.refresh(a.token, "/a/x", 2*time.Minute); err != nil {
		t.Errorf("refresh through a member: %v", err)
	}
	now = now.Add(90 * time.Second)
	if _, err := m.create("/a/b", false, true, "", time.Minute, false); err != webdav.ErrLocked {
		t.Errorf("the refreshed lock expired early: %v", err)
	}
	now = now.Add(time.Minute)
	if _, err := m.create("/a/b", false, true, "", time.Minute, false); err != nil {
		t.Errorf("an expired lock still conflicts: %v", err)
	}
	if err := m.unlock(a.token, ""); err != webdav.ErrNoSuchLock {
		t.Errorf("unlock of an expired lock: %v", err)
	}
}

func TestPropAttr(t *testing.T) {
	if got := propAttr(xmlName("urn:x", "colour")); got != "dav:{urn:x}colour" {
		t.Errorf("propAttr = %q", got)
	}
	long := propAttr(xmlName(strings.Repeat("n", 300), "p"))
	tricky := propAttr(xmlName("a}b", "c"))
	if !strings.HasPrefix(long, "dav:#") || len(long) != 5+32 || !strings.HasPrefix(tricky, "dav:#") || long == tricky {
		t.Errorf("hashed names: %q %q", long, tricky)
	}
	p := webdav.Property{XMLName: xmlName("urn:x", "c"), Lang: "de", InnerXML: []byte(`<b xmlns="urn:y">grün</b>`)}
	back, err := decodeProp(encodeProp(p))
	if err != nil || !reflect.DeepEqual(back, p) {
		t.Errorf("decodeProp(encodeProp) = %+v, %v", back, err)
	}
	big := webdav.Property{XMLName: xmlName("urn:x", "big"), InnerXML: bytes.Repeat([]byte("x"), 70<<10)}
	ps := checkPatch([]webdav.Proppatch{{Props: []webdav.Property{big, p}}})
	if len(ps) != 2 || ps[0].Status != 507 || ps[1].Status != webdav.StatusFailedDependency {
		t.Errorf("checkPatch of an oversized value: %+v", ps)
	}
}

// FuzzIfHeader: the header parsers never panic, and what parseIf accepts
// renders back to a header that parses to the same lists.
func FuzzIfHeader(f *testing.F) {
	for _, s := range []string{`(<urn:uuid:1> ["e"])`, `<http://h/a> (Not <DAV:no-lock>) (<t>)`, `([W/"x"])`, `Second-10, Infinite`, `<tok>`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		parseTimeout(s)
		parseLockToken(s)
		parseDepth(s, 0)
		lists, err := parseIf(s)
		if err != nil {
			return
		}
		again, err := parseIf(renderIf(lists))
		if err != nil || !reflect.DeepEqual(again, lists) {
			t.Fatalf("parseIf(%q) = %+v; rendered %q parses to %+v, %v", s, lists, renderIf(lists), again, err)
		}
	})
}

// FuzzXMLBody: the body checks never panic, and an accepted lock's owner
// is a piece of the body.
func FuzzXMLBody(f *testing.F) {
	for _, s := range []string{
		`<D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype><D:owner>me</D:owner></D:lockinfo>`,
		`<propfind xmlns="DAV:"><prop><x xmlns:p=""/></prop></propfind>`,
		`<a><![CDATA[x]]></a>`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkXMLBody(b)
		lr, err := parseLockInfo(b)
		if err == nil && !bytes.Contains(b, []byte(lr.Owner)) {
			t.Fatalf("owner %q is not in the body %q", lr.Owner, b)
		}
	})
}

func xmlName(space, local string) xml.Name { return xml.Name{Space: space, Local: local} }
