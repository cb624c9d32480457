package vpath

import (
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
)

func TestParse(t *testing.T) {
	good := map[string]string{
		"home:/":          "home:/",
		"home:":           "home:/",
		"home:/a/b":       "home:/a/b",
		"home:a//b/./c/":  "home:/a/b/c",
		"my-vol.2:/x y/z": "my-vol.2:/x y/z",
	}
	for in, want := range good {
		p, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if p.String() != want {
			t.Errorf("Parse(%q) = %q, want %q", in, p.String(), want)
		}
	}
	bad := []string{"noslash", ":/a", "Home:/a", "home:/a/../b", "home:/..", "home:/a\x00b",
		"-x:/a", "home:/" + strings.Repeat("x", 256), "home:/\xff"}
	for _, in := range bad {
		if _, err := Parse(in); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("Parse(%q) err = %v, want Invalid", in, err)
		}
	}
}

func TestIsRemote(t *testing.T) {
	for s, want := range map[string]bool{
		"home:/a": true, "home:": true, "./home:/a": false, "/tmp/a:b": false, "a/b:c": false, "C:x": false,
	} {
		if got := IsRemote(s); got != want {
			t.Errorf("IsRemote(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestPathHelpers(t *testing.T) {
	p, _ := Parse("v:/a/b")
	if p.Base() != "b" || p.Dir().String() != "v:/a" || p.Join("c").String() != "v:/a/b/c" || p.Slash() != "/a/b" {
		t.Fatalf("helpers wrong: %q %q %q", p.Base(), p.Dir(), p.Join("c"))
	}
	if q := p.Join("c"); len(p.Parts) != 2 || q.Parts[0] != "a" {
		t.Fatalf("Join aliased its receiver")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"home:/a/b", "home:/../x", "v:/./a//b", "x", ":", "a:/\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			if !errors.Is(err, cairn.ErrInvalid) {
				t.Fatalf("Parse(%q) error not Invalid: %v", s, err)
			}
			return
		}
		for _, c := range p.Parts {
			if ValidName(c) != nil {
				t.Fatalf("Parse(%q) kept invalid component %q", s, c)
			}
		}
		// Canonical form parses back to itself.
		q, err := Parse(p.String())
		if err != nil || q.String() != p.String() {
			t.Fatalf("round trip of %q: %q, %v", p.String(), q.String(), err)
		}
	})
}
