package dav_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/dav"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// multistatus is the part of a PROPFIND answer the tests read.
type multistatus struct {
	Responses []struct {
		Href     string `xml:"href"`
		Propstat []struct {
			Prop struct {
				Inner []byte `xml:",innerxml"`
			} `xml:"prop"`
			Status string `xml:"status"`
		} `xml:"propstat"`
	} `xml:"response"`
}

func (f *fixture) propfind(path, depth, body string) multistatus {
	f.t.Helper()
	b, _ := f.status(http.StatusMultiStatus, "PROPFIND", path, body, "Depth", depth)
	var ms multistatus
	if err := xml.Unmarshal([]byte(b), &ms); err != nil {
		f.t.Fatalf("PROPFIND %s: %v\n%s", path, err, b)
	}
	return ms
}

func (ms multistatus) hrefs() []string {
	var out []string
	for _, r := range ms.Responses {
		out = append(out, r.Href)
	}
	return out
}

const propBody = `<?xml version="1.0"?><D:propfind xmlns:D="DAV:" xmlns:Z="urn:test:"><D:prop><Z:colour/></D:prop></D:propfind>`

func setColour(value string) string {
	return `<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:Z="urn:test:"><D:set><D:prop><Z:colour>` +
		value + `</Z:colour></D:prop></D:set></D:propertyupdate>`
}

// TestExchange is a client's session: every method, the bytes checked in
// the volume itself, not through the gateway.
func TestExchange(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	f.status(http.StatusCreated, "MKCOL", "/docs", "")
	f.status(http.StatusMethodNotAllowed, "MKCOL", "/docs", "")
	f.status(http.StatusConflict, "MKCOL", "/no/such/parent", "")

	big := randBytes(300 << 10) // several chunks
	f.status(http.StatusCreated, "PUT", "/docs/a.bin", string(big))
	if got := f.content("/docs/a.bin"); !bytes.Equal(got, big) {
		t.Fatalf("stored %d bytes, want the %d put", len(got), len(big))
	}
	f.status(http.StatusConflict, "PUT", "/nodir/x", "data")

	body, resp := f.status(http.StatusOK, "GET", "/docs/a.bin", "")
	if body != string(big) {
		t.Fatalf("GET returned %d bytes, want %d", len(body), len(big))
	}
	etag := resp.Header.Get("ETag")
	if !regexp.MustCompile(`^"[0-9a-f]{32}"$`).MatchString(etag) {
		t.Fatalf("ETag %q, want a quoted content digest", etag)
	}

	// A range from the middle, then a HEAD.
	body, _ = f.status(http.StatusPartialContent, "GET", "/docs/a.bin", "", "Range", "bytes=200000-200099")
	if body != string(big[200000:200100]) {
		t.Fatalf("range read the wrong bytes")
	}
	_, resp = f.status(http.StatusOK, "HEAD", "/docs/a.bin", "")
	if resp.ContentLength != int64(len(big)) {
		t.Fatalf("HEAD: length %d, want %d", resp.ContentLength, len(big))
	}
	f.status(http.StatusNotModified, "GET", "/docs/a.bin", "", "If-None-Match", etag)

	// A second PUT is a new version; the old one is kept.
	f.status(http.StatusNoContent, "PUT", "/docs/a.bin", "version two")
	e, err := f.vol.Meta.Lookup(ctx, []string{"docs", "a.bin"})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Versions) != 2 || e.Current().Size != int64(len("version two")) {
		t.Fatalf("after two PUTs: %d versions, current %d bytes", len(e.Versions), e.Current().Size)
	}

	f.status(http.StatusCreated, "COPY", "/docs/a.bin", "", "Destination", f.srv.URL+"/docs/b.bin")
	if got := string(f.content("/docs/b.bin")); got != "version two" {
		t.Fatalf("copy holds %q", got)
	}
	f.status(http.StatusPreconditionFailed, "COPY", "/docs/a.bin", "", "Destination", f.srv.URL+"/docs/b.bin", "Overwrite", "F")

	f.status(http.StatusCreated, "MOVE", "/docs/b.bin", "", "Destination", f.srv.URL+"/c.bin")
	f.status(http.StatusNotFound, "GET", "/docs/b.bin", "")
	if got := string(f.content("/c.bin")); got != "version two" {
		t.Fatalf("moved file holds %q", got)
	}
	// A file moved over a file (an editor's save through WebDAV: a
	// temporary file moved over the original) becomes the next version
	// of the destination's history; nothing goes to the trash.
	f.status(http.StatusCreated, "PUT", "/docs/save.tmp", "version three")
	f.status(http.StatusNoContent, "MOVE", "/docs/save.tmp", "", "Destination", f.srv.URL+"/docs/a.bin", "Overwrite", "T")
	f.status(http.StatusNotFound, "GET", "/docs/save.tmp", "")
	if e, err = f.vol.Meta.Lookup(ctx, []string{"docs", "a.bin"}); err != nil {
		t.Fatal(err)
	}
	if len(e.Versions) != 3 || e.Versions[2].N != 3 || string(f.content("/docs/a.bin")) != "version three" {
		t.Fatalf("after a MOVE over a.bin: %d versions, content %q", len(e.Versions), f.content("/docs/a.bin"))
	}
	var prev bytes.Buffer
	if err := f.vol.ReadFile(ctx, e, &e.Versions[1], &prev); err != nil || prev.String() != "version two" {
		t.Fatalf("a.bin's version 2 after the MOVE: %q, %v", prev.String(), err)
	}
	if trash, err := f.vol.Meta.Trash(ctx); err != nil || len(trash) != 0 {
		t.Fatalf("trash after a MOVE over a file: %d items, %v", len(trash), err)
	}
	// A collection moves with its contents.
	f.status(http.StatusCreated, "MOVE", "/docs", "", "Destination", f.srv.URL+"/papers")
	if got := string(f.content("/papers/a.bin")); got != "version three" {
		t.Fatalf("moved collection's file holds %q", got)
	}
	f.status(http.StatusForbidden, "MOVE", "/papers", "", "Destination", f.srv.URL+"/papers/inside")
	f.status(http.StatusForbidden, "COPY", "/papers", "", "Destination", f.srv.URL+"/papers/inside")
	f.status(http.StatusForbidden, "MOVE", "/papers/a.bin", "", "Destination", f.srv.URL+"/papers", "Overwrite", "T")
	if got := string(f.content("/papers/a.bin")); got != "version three" {
		t.Fatalf("a refused move onto an ancestor changed the source: %q", got)
	}

	// Dead properties, on a file and on a collection.
	f.status(http.StatusMultiStatus, "PROPPATCH", "/c.bin", setColour("blue"))
	f.status(http.StatusMultiStatus, "PROPPATCH", "/papers", setColour("green"))
	ms := f.propfind("/c.bin", "0", propBody)
	if len(ms.Responses) != 1 || !strings.Contains(string(ms.Responses[0].Propstat[0].Prop.Inner), "blue") {
		t.Fatalf("PROPFIND of the property set: %+v", ms)
	}
	ms = f.propfind("/", "1", "")
	hrefs := strings.Join(ms.hrefs(), " ")
	for _, want := range []string{"/c.bin", "/papers/"} {
		if !strings.Contains(hrefs, want) {
			t.Fatalf("PROPFIND depth 1 of / lists %s, want %s", hrefs, want)
		}
	}
	if strings.Contains(hrefs, "a.bin") {
		t.Fatalf("PROPFIND depth 1 went deeper: %s", hrefs)
	}
	f.status(http.StatusForbidden, "PROPFIND", "/", "", "Depth", "infinity")
	// A copy takes the source's dead properties along.
	f.status(http.StatusCreated, "COPY", "/c.bin", "", "Destination", f.srv.URL+"/d.bin")
	ms = f.propfind("/d.bin", "0", propBody)
	if !strings.Contains(string(ms.Responses[0].Propstat[0].Prop.Inner), "blue") {
		t.Fatalf("the copy lost its dead property: %+v", ms)
	}

	// LOCK, a write with and without the token, UNLOCK.
	lockBody := `<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype><D:owner>test</D:owner></D:lockinfo>`
	b, resp := f.status(http.StatusOK, "LOCK", "/c.bin", lockBody, "Timeout", "Second-600")
	tok := resp.Header.Get("Lock-Token")
	if !strings.HasPrefix(tok, "<urn:uuid:") || !strings.Contains(b, "Second-600") || !strings.Contains(b, "<D:owner>test</D:owner>") {
		t.Fatalf("LOCK answered token %q and\n%s", tok, b)
	}
	f.status(http.StatusLocked, "PUT", "/c.bin", "intruder")
	f.status(http.StatusLocked, "DELETE", "/c.bin", "")
	f.status(http.StatusLocked, "LOCK", "/c.bin", lockBody)
	f.status(http.StatusNoContent, "PUT", "/c.bin", "owner", "If", "("+tok+")")
	if got := string(f.content("/c.bin")); got != "owner" {
		t.Fatalf("locked file holds %q after its owner's PUT", got)
	}
	f.status(http.StatusConflict, "UNLOCK", "/c.bin", "", "Lock-Token", "<urn:uuid:not-a-lock>")
	f.status(http.StatusNoContent, "UNLOCK", "/c.bin", "", "Lock-Token", tok)
	f.status(http.StatusNoContent, "PUT", "/c.bin", "anyone")

	// DELETE moves to the trash, whence it can be restored.
	f.status(http.StatusNoContent, "DELETE", "/papers", "")
	f.status(http.StatusNotFound, "PROPFIND", "/papers", "", "Depth", "0")
	trash, err := f.vol.Meta.Trash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, it := range trash {
		found = found || it.Path == "v:/papers" && it.Entry.IsDir()
	}
	if !found {
		t.Fatalf("DELETE of /papers left no trash item: %+v", trash)
	}
	f.status(http.StatusNotFound, "DELETE", "/papers", "")
	f.status(http.StatusMethodNotAllowed, "DELETE", "/", "")
}

// TestAuth: no credentials, wrong ones and a removed user are refused
// with a challenge; repeated wrong passwords from one address are refused
// outright for a while.
func TestAuth(t *testing.T) {
	f := newFixture(t)
	send := func(user, pass string, auth bool) *http.Response {
		r, _ := http.NewRequest("PROPFIND", f.srv.URL+"/", nil)
		r.Header.Set("Depth", "0")
		if auth {
			r.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	challenged := func(resp *http.Response, what string) {
		t.Helper()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: status %d, want 401", what, resp.StatusCode)
		}
		if h := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(h, `Basic realm="`) {
			t.Fatalf("%s: WWW-Authenticate %q", what, h)
		}
	}
	challenged(send("", "", false), "no credentials")
	challenged(send(f.user, "wrong", true), "wrong password")
	challenged(send("mallory", f.pass, true), "unknown user")
	if resp := send(f.user, f.pass, true); resp.StatusCode != http.StatusMultiStatus {
		t.Fatalf("right password: status %d", resp.StatusCode)
	}
	// A second user; removing it locks it out at once (no restart).
	bobPass, err := f.users.Add("bob", false)
	if err != nil {
		t.Fatal(err)
	}
	if resp := send("bob", bobPass, true); resp.StatusCode != http.StatusMultiStatus {
		t.Fatalf("new user: status %d", resp.StatusCode)
	}
	if err := f.users.Remove("bob"); err != nil {
		t.Fatal(err)
	}
	challenged(send("bob", bobPass, true), "removed user")

	// Ten wrong passwords: then even the right one waits.
	for i := 0; i < 10; i++ {
		send(f.user, fmt.Sprintf("guess%d", i), true)
	}
	resp := send(f.user, f.pass, true)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("after 10 wrong passwords: status %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestDeadPropsPersist: properties set through one gateway are read by a
// new gateway (a restart, or another device's) on a volume opened anew,
// and live in the metadata under the dav: prefix, apart from user.*
// attributes.
func TestDeadPropsPersist(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.status(http.StatusCreated, "PUT", "/p.txt", "x")
	f.status(http.StatusMultiStatus, "PROPPATCH", "/p.txt", setColour("red"))

	e, err := f.vol.Meta.Lookup(ctx, []string{"p.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if serr := f.vol.Meta.SetXattr(ctx, e.Ino, "user.colour", []byte("not a dead property"), meta.XattrAny); serr != nil {
		t.Fatal(serr)
	}
	attrs, err := f.vol.Meta.Xattrs(ctx, e.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := attrs["dav:{urn:test:}colour"]; !ok {
		t.Fatalf("attributes %v: want dav:{urn:test:}colour", attrs)
	}

	f.srv.Close()
	f.h.Close()
	h2 := f.newHandler(f.openVolume())
	srv2 := httptest.NewServer(h2)
	defer srv2.Close()
	resp := f.reqTo(srv2.URL, "PROPFIND", "/p.txt", strings.NewReader(""), "Depth", "0")
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusMultiStatus || !strings.Contains(string(b), "red") {
		t.Fatalf("new gateway: status %d\n%s", resp.StatusCode, b)
	}
	if strings.Contains(string(b), "not a dead property") {
		t.Fatalf("a user.* attribute showed as a dead property:\n%s", b)
	}
	// Removed through the new one, gone from the metadata.
	rm := `<?xml version="1.0"?><D:propertyupdate xmlns:D="DAV:" xmlns:Z="urn:test:"><D:remove><D:prop><Z:colour/></D:prop></D:remove></D:propertyupdate>`
	if resp := f.reqTo(srv2.URL, "PROPPATCH", "/p.txt", strings.NewReader(rm)); resp.StatusCode != http.StatusMultiStatus {
		t.Fatalf("PROPPATCH remove: %d", resp.StatusCode)
	}
	attrs, err = f.vol.Meta.Xattrs(ctx, e.Ino)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := attrs["dav:{urn:test:}colour"]; ok || len(attrs) != 1 {
		t.Fatalf("after removal: attributes %v, want only user.colour", attrs)
	}
}

// TestUploadCutShort: a PUT whose client goes away mid-body commits
// nothing: the previous version stays current.
func TestUploadCutShort(t *testing.T) {
	f := newFixture(t)
	f.status(http.StatusCreated, "PUT", "/f", "the old content")
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := http.NewRequest("PUT", f.srv.URL+"/f", nil)
	r.SetBasicAuth(f.user, f.pass)
	auth := r.Header.Get("Authorization")
	fmt.Fprintf(conn, "PUT /f HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: 100000\r\n\r\n", auth)
	conn.Write(bytes.Repeat([]byte("n"), 5000))
	time.Sleep(100 * time.Millisecond)
	conn.Close()
	// The handler sees the body end early; wait until it has answered (its
	// request is logged when it ends), then check it did not succeed.
	done := regexp.MustCompile(`msg="webdav request" volume=v method=PUT path=/f user=alice status=(\d+)`)
	deadline := time.Now().Add(10 * time.Second)
	for len(done.FindAllString(f.logs.String(), -1)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the cut PUT did not end within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := done.FindAllStringSubmatch(f.logs.String(), -1); m[1][1][0] == '2' {
		t.Fatalf("the cut PUT answered %s", m[1][1])
	}
	if got := string(f.content("/f")); got != "the old content" {
		t.Fatalf("after a cut upload the file holds %d bytes %.20q", len(got), got)
	}
	e, err := f.vol.Meta.Lookup(context.Background(), []string{"f"})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Versions) != 1 {
		t.Fatalf("a cut upload made a version: %d versions", len(e.Versions))
	}
}

// TestConditionalPut: If-Match and If-None-Match guard PUT and DELETE
// against lost updates; an If header with an entity tag does too.
func TestConditionalPut(t *testing.T) {
	f := newFixture(t)
	_, resp := f.status(http.StatusCreated, "PUT", "/f", "one", "If-None-Match", "*")
	etag := resp.Header.Get("ETag")
	f.status(http.StatusPreconditionFailed, "PUT", "/f", "two", "If-None-Match", "*")
	f.status(http.StatusPreconditionFailed, "PUT", "/f", "two", "If-Match", `"0123"`)
	f.status(http.StatusPreconditionFailed, "PUT", "/f", "two", "If", `(["0123"])`)
	f.status(http.StatusNoContent, "PUT", "/f", "two", "If-Match", etag)
	f.status(http.StatusPreconditionFailed, "DELETE", "/f", "", "If-Match", etag) // it changed
	f.status(http.StatusPreconditionFailed, "PUT", "/g", "new", "If-Match", "*")
	f.status(http.StatusBadRequest, "PUT", "/f", "x", "If", `(<unterminated`)
	if got := string(f.content("/f")); got != "two" {
		t.Fatalf("file holds %q", got)
	}
}

// TestLockScopes: shared locks coexist, an exclusive one does not; a
// depth-infinity lock on a collection guards what is below it; a lock on
// an unmapped URL makes an empty file.
func TestLockScopes(t *testing.T) {
	f := newFixture(t)
	lock := func(scope string) string {
		return `<?xml version="1.0"?><D:lockinfo xmlns:D="DAV:"><D:lockscope><D:` + scope + `/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>`
	}
	f.status(http.StatusCreated, "PUT", "/s", "x")
	_, r1 := f.status(http.StatusOK, "LOCK", "/s", lock("shared"), "Depth", "0")
	_, r2 := f.status(http.StatusOK, "LOCK", "/s", lock("shared"), "Depth", "0")
	f.status(http.StatusLocked, "LOCK", "/s", lock("exclusive"), "Depth", "0")
	f.status(http.StatusLocked, "PUT", "/s", "y")
	f.status(http.StatusNoContent, "PUT", "/s", "y", "If", "("+r2.Header.Get("Lock-Token")+")")
	f.status(http.StatusNoContent, "UNLOCK", "/s", "", "Lock-Token", r1.Header.Get("Lock-Token"))
	f.status(http.StatusNoContent, "UNLOCK", "/s", "", "Lock-Token", r2.Header.Get("Lock-Token"))
	f.status(http.StatusOK, "LOCK", "/s", lock("exclusive"), "Depth", "0")

	f.status(http.StatusCreated, "MKCOL", "/c", "")
	f.status(http.StatusCreated, "PUT", "/c/in", "x")
	b, rc := f.status(http.StatusOK, "LOCK", "/c", lock("exclusive"))
	if !strings.Contains(b, "<D:depth>infinity</D:depth>") {
		t.Fatalf("LOCK without Depth is of depth infinity:\n%s", b)
	}
	ctok := rc.Header.Get("Lock-Token")
	f.status(http.StatusLocked, "PUT", "/c/in", "y")
	f.status(http.StatusLocked, "PUT", "/c/new", "y")
	f.status(http.StatusNoContent, "PUT", "/c/in", "y", "If", "<"+f.srv.URL+"/c> ("+ctok+")")
	// A list tagged with a resource the client holds does not unlock
	// another one.
	_, rs := f.status(http.StatusCreated, "LOCK", "/mine", lock("exclusive"))
	f.status(http.StatusLocked, "PUT", "/c/in", "z", "If", "<"+f.srv.URL+"/mine> ("+rs.Header.Get("Lock-Token")+")")
	// A member's lock blocks removing its collection.
	f.status(http.StatusNoContent, "UNLOCK", "/c", "", "Lock-Token", ctok)
	f.status(http.StatusOK, "LOCK", "/c/in", lock("exclusive"), "Depth", "0")
	f.status(http.StatusLocked, "DELETE", "/c", "")
	f.status(http.StatusLocked, "MOVE", "/c", "", "Destination", f.srv.URL+"/c2")

	if got := f.content("/mine"); len(got) != 0 {
		t.Fatalf("LOCK of an unmapped URL made a file of %d bytes", len(got))
	}
	// Refresh with an empty body and the token in If.
	b, _ = f.status(http.StatusOK, "LOCK", "/mine", "", "If", "("+rs.Header.Get("Lock-Token")+")", "Timeout", "Second-30")
	if !strings.Contains(b, "Second-30") {
		t.Fatalf("refresh answered\n%s", b)
	}
	f.status(http.StatusPreconditionFailed, "LOCK", "/s", "", "If", "("+rs.Header.Get("Lock-Token")+")")
	f.status(http.StatusBadRequest, "LOCK", "/s", "<not xml")
	f.status(http.StatusBadRequest, "LOCK", "/s", lock("exclusive"), "Depth", "1")
}

// TestServeTLS serves over HTTPS with a certificate of a realm CA and
// stops when its context ends.
func TestServeTLS(t *testing.T) {
	f := newFixture(t)
	ca, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	creds, err := ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: "gw", Role: pki.Device}, pki.IssueOptions{Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dav.Serve(ctx, ln, f.h, dav.TLSConfig(creds.TLSCertificate()), nil) }()

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + ln.Addr().String() + "/x.txt"
	r, _ := http.NewRequest("PUT", url, strings.NewReader("over tls"))
	r.SetBasicAuth(f.user, f.pass)
	resp, err := client.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("PUT over TLS: %d", resp.StatusCode)
	}
	if got := string(f.content("/x.txt")); got != "over tls" {
		t.Fatalf("stored %q", got)
	}
	// A client that does not trust the realm CA is refused.
	if _, err := http.Get(url); err == nil {
		t.Fatal("a client without the realm CA connected")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:80": true, "127.1.2.3:1": true, "[::1]:8080": true, "localhost:4918": true,
		"0.0.0.0:80": false, ":80": false, "192.168.1.2:80": false, "[::]:80": false, "example.com:80": false,
	} {
		got, err := dav.IsLoopback(addr)
		if err != nil || got != want {
			t.Errorf("IsLoopback(%q) = %v, %v; want %v", addr, got, err, want)
		}
	}
	if _, err := dav.IsLoopback("no-port"); err == nil {
		t.Error("IsLoopback accepted an address without a port")
	}
}

// TestSymlinksHidden: a symbolic link made by another client is neither
// listed nor served.
func TestSymlinksHidden(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	root, err := f.vol.Meta.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.vol.Meta.Create(ctx, root, meta.Entry{Name: "link", Type: meta.TypeSymlink, Target: "/etc/passwd", Mode: 0o777}); err != nil {
		t.Fatal(err)
	}
	f.status(http.StatusNotFound, "GET", "/link", "")
	if hrefs := f.propfind("/", "1", "").hrefs(); strings.Contains(strings.Join(hrefs, " "), "link") {
		t.Fatalf("listing shows the symlink: %v", hrefs)
	}
	f.status(http.StatusNotFound, "PUT", "/link", "x")
}

// TestSpecialFilesHidden: FIFOs, sockets and device nodes made on a
// mount are neither listed nor served (404), and an upload or MKCOL onto
// one of their names does not replace it.
func TestSpecialFilesHidden(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	root, err := f.vol.Meta.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	specials := map[string]meta.Entry{
		"fifo": {Type: meta.TypeFIFO, Mode: 0o644},
		"sock": {Type: meta.TypeSocket, Mode: 0o755},
		"null": {Type: meta.TypeChar, Mode: 0o666, Rdev: 1<<8 | 3},
		"sda":  {Type: meta.TypeBlock, Mode: 0o660, Rdev: 8 << 8},
	}
	for name, e := range specials {
		e.Name = name
		if _, err := f.vol.Meta.Create(ctx, root, e); err != nil {
			t.Fatal(err)
		}
	}
	f.status(http.StatusCreated, "PUT", "/file", "x")
	hrefs := f.propfind("/", "1", "").hrefs()
	for name := range specials {
		if strings.Contains(strings.Join(hrefs, " "), name) {
			t.Errorf("listing shows %s: %v", name, hrefs)
		}
		f.status(http.StatusNotFound, "GET", "/"+name, "")
		f.status(http.StatusNotFound, "PROPFIND", "/"+name, "", "Depth", "0")
		if code := f.req("PUT", "/"+name, strings.NewReader("x")).StatusCode; code < 400 {
			t.Errorf("PUT onto %s: status %d", name, code)
		}
		if code := f.req("MKCOL", "/"+name, nil).StatusCode; code < 400 {
			t.Errorf("MKCOL onto %s: status %d", name, code)
		}
		if e, err := f.vol.Meta.Get(ctx, root.Ino, name); err != nil || e.Type != specials[name].Type || e.Rdev != specials[name].Rdev {
			t.Errorf("%s after PUT and MKCOL: %+v, %v", name, e, err)
		}
	}
	if !strings.Contains(strings.Join(hrefs, " "), "file") {
		t.Errorf("listing misses the file: %v", hrefs)
	}
}

// TestBadPaths: a path with ".." is refused, never resolved.
func TestBadPaths(t *testing.T) {
	f := newFixture(t)
	f.status(http.StatusCreated, "MKCOL", "/a", "")
	conn, err := net.Dial("tcp", strings.TrimPrefix(f.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r, _ := http.NewRequest("GET", f.srv.URL, nil)
	r.SetBasicAuth(f.user, f.pass)
	fmt.Fprintf(conn, "MKCOL /a/../b HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: 0\r\n\r\n", r.Header.Get("Authorization"))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode < 400 {
		t.Fatalf("MKCOL /a/../b: status %d", resp.StatusCode)
	}
	if _, lerr := f.vol.Meta.Lookup(context.Background(), []string{"b"}); lerr == nil {
		t.Fatal("MKCOL /a/../b made /b")
	}
	lockBody := `<D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype></D:lockinfo>`
	fmt.Fprintf(conn, "LOCK /a/../c HTTP/1.1\r\nHost: x\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n%s", r.Header.Get("Authorization"), len(lockBody), lockBody)
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("LOCK /a/../c: status %d, want 400", resp.StatusCode)
	}
	if _, err := f.vol.Meta.Lookup(context.Background(), []string{"c"}); err == nil {
		t.Fatal("LOCK /a/../c made /c")
	}
}

// TestPropfindLargeDir lists a directory of 500 files with PROPFIND depth
// 1 (every entry once, with its properties) and logs how long it took.
func TestPropfindLargeDir(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	f := newFixture(t)
	f.status(http.StatusCreated, "MKCOL", "/big", "")
	for i := 0; i < 500; i++ {
		f.status(http.StatusCreated, "PUT", fmt.Sprintf("/big/f%04d.txt", i), "x")
	}
	f.status(http.StatusMultiStatus, "PROPPATCH", "/big/f0007.txt", setColour("teal"))
	start := time.Now()
	ms := f.propfind("/big", "1", `<?xml version="1.0"?><D:propfind xmlns:D="DAV:"><D:allprop/></D:propfind>`)
	d := time.Since(start)
	seen := map[string]bool{}
	for _, r := range ms.Responses {
		seen[r.Href] = true
		if r.Href == "/big/f0007.txt" && !strings.Contains(string(r.Propstat[0].Prop.Inner), "teal") {
			t.Errorf("f0007.txt listed without its dead property: %s", r.Propstat[0].Prop.Inner)
		}
	}
	if len(ms.Responses) != 501 || !seen["/big/"] || !seen["/big/f0000.txt"] || !seen["/big/f0499.txt"] {
		t.Fatalf("%d responses, want /big/ and its 500 files", len(ms.Responses))
	}
	t.Logf("PROPFIND depth 1 of 500 files: %v", d)
}
