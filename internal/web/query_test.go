package web

import (
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestParseVersionsQuery(t *testing.T) {
	good := map[string][2]string{
		"vol=home&path=/a.txt":          {"home", "/a.txt"},
		"path=%2Fa%2F%2F.%2Fb&vol=docs": {"docs", "/a/b"},
		"vol=home&path=/a%20b/c%3Cx%3E": {"home", "/a b/c<x>"},
	}
	for q, want := range good {
		vol, path, err := ParseVersionsQuery(q)
		if err != nil || vol != want[0] || path != want[1] {
			t.Errorf("ParseVersionsQuery(%q) = %q, %q, %v; want %q, %q", q, vol, path, err, want[0], want[1])
		}
	}
	bad := []string{
		"", "vol=home", "path=/a", "vol=&path=/a", "vol=home&path=", "vol=home&path=a",
		"vol=home&path=/a/../b", "vol=home&path=/..", "vol=home&path=/", "vol=home&path=//",
		"vol=Home!&path=/a", "vol=home&path=/a&path=/b", "vol=home&vol=x&path=/a",
		"vol=home&path=/a&other=1", "vol=home&path=/a%00b", "vol=home&path=%zz",
		"vol=home&path=/" + strings.Repeat("a", 5000), "vol=home&path=/a%ffb",
	}
	for _, q := range bad {
		if vol, path, err := ParseVersionsQuery(q); err == nil {
			t.Errorf("ParseVersionsQuery(%q) = %q, %q; want an error", q, vol, path)
		} else if !errors.Is(err, cairn.ErrInvalid) && !errors.Is(err, cairn.ErrIsDir) {
			t.Errorf("ParseVersionsQuery(%q): %v, not an Invalid or IsDir error", q, err)
		}
	}
}

func TestParseVolumeQuery(t *testing.T) {
	if vol, err := ParseVolumeQuery("vol=home"); err != nil || vol != "home" {
		t.Fatalf("ParseVolumeQuery(vol=home) = %q, %v", vol, err)
	}
	for _, q := range []string{"", "vol=", "vol=a&vol=b", "vol=x/y", "vol=home&path=/a", "%"} {
		if vol, err := ParseVolumeQuery(q); err == nil {
			t.Errorf("ParseVolumeQuery(%q) = %q; want an error", q, vol)
		}
	}
}

// FuzzParseVersionsQuery: any query either fails cleanly or yields a
// valid volume and a clean absolute path that names no parent and parses
// back to itself.
func FuzzParseVersionsQuery(f *testing.F) {
	for _, s := range []string{"vol=home&path=/a.txt", "vol=home&path=/a/../b", "path=%2F&vol=x", "vol=a&path=/%00", "vol=home&path=//a//b/./c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		vol, path, err := ParseVersionsQuery(q)
		if err != nil {
			var ce *cairn.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a cairn.Error", err)
			}
			return
		}
		if vol == "" || !strings.HasPrefix(path, "/") || path == "/" || strings.Contains(path, "//") || strings.HasSuffix(path, "/") {
			t.Fatalf("ParseVersionsQuery(%q) = %q, %q", q, vol, path)
		}
		for _, c := range strings.Split(path[1:], "/") {
			if c == "." || c == ".." || c == "" {
				t.Fatalf("ParseVersionsQuery(%q) = path %q with component %q", q, path, c)
			}
		}
		v2, p2, err := ParseVersionsQuery("vol=" + vol + "&path=" + urlEscape(path))
		if err != nil || v2 != vol || p2 != path {
			t.Fatalf("round trip of %q, %q: %q, %q, %v", vol, path, v2, p2, err)
		}
	})
}

// FuzzParseRestore: any body gives a cairn.Error or a request whose paths
// are clean and below the root, with exactly one of version and
// from_trash, and to only with from_trash.
func FuzzParseRestore(f *testing.F) {
	for _, s := range []string{`{"vol":"home","path":"/a","version":2}`, `{"vol":"home","path":"/a/../b","from_trash":true,"to":"/c"}`,
		`{"vol":"home","path":"/a"}{}`, `{"vol":"x","path":"//a//b/./c","version":1,"from_trash":true}`, `[]`, `{"path":1}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req, err := ParseRestore(strings.NewReader(body))
		if err != nil {
			var ce *cairn.Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a cairn.Error", err)
			}
			return
		}
		if (req.Version == 0) == !req.FromTrash || (req.To != "" && !req.FromTrash) {
			t.Fatalf("ParseRestore(%q) = %+v", body, req)
		}
		for _, p := range []string{req.Path, req.To} {
			if p == "" && p == req.To {
				continue
			}
			if c, err := cleanFilePath(p); err != nil || c != p {
				t.Fatalf("ParseRestore(%q): path %q not clean (%q, %v)", body, p, c, err)
			}
		}
	})
}
