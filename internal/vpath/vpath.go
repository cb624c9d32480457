// Package vpath parses and validates the paths cairn users write:
// "VOLUME:/dir/file". It is the one place that decides what a volume name and
// a file name may be, for the CLI and for names read back from metadata.
package vpath

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"cairn.dev/cairn/internal/cairn"
)

// Limits on names and paths.
const (
	MaxName       = 255
	MaxPath       = 4096
	MaxVolumeName = 64
)

// Path is a parsed cairn path: a volume and the clean components below its root.
type Path struct {
	Volume string
	Parts  []string // empty for the root
}

// String renders the canonical "VOLUME:/a/b" form.
func (p Path) String() string { return p.Volume + ":/" + strings.Join(p.Parts, "/") }

// Slash renders the path inside the volume, "/a/b".
func (p Path) Slash() string { return "/" + strings.Join(p.Parts, "/") }

// IsRoot reports whether p names the volume's root directory.
func (p Path) IsRoot() bool { return len(p.Parts) == 0 }

// Base returns the last component ("" for the root).
func (p Path) Base() string {
	if len(p.Parts) == 0 {
		return ""
	}
	return p.Parts[len(p.Parts)-1]
}

// Dir returns the parent directory (the root's parent is the root).
func (p Path) Dir() Path {
	if len(p.Parts) == 0 {
		return p
	}
	return Path{Volume: p.Volume, Parts: p.Parts[:len(p.Parts)-1]}
}

// Join returns p with name appended; name must be a valid single component.
func (p Path) Join(name string) Path {
	parts := make([]string, len(p.Parts), len(p.Parts)+1)
	copy(parts, p.Parts)
	return Path{Volume: p.Volume, Parts: append(parts, name)}
}

// IsRemote reports whether s looks like a cairn path ("VOLUME:..."), as
// opposed to a local file path. A local path that must contain a colon can be
// written with a leading "./".
func IsRemote(s string) bool {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.ContainsRune(s[:i], '/') {
		return false
	}
	return ValidVolume(s[:i]) == nil
}

// Parse parses "VOLUME:/a/b". Empty components and "." are dropped; ".." is
// refused rather than resolved, so a path can never climb out of its volume
// or mean something other than what it says.
func Parse(s string) (Path, error) {
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return Path{}, cairn.E("parse path", cairn.Invalid, s, fmt.Errorf("want VOLUME:/path"))
	}
	vol, rest := s[:i], s[i+1:]
	if err := ValidVolume(vol); err != nil {
		return Path{}, cairn.E("parse path", cairn.Invalid, s, err)
	}
	parts, err := SplitClean(rest)
	if err != nil {
		return Path{}, cairn.E("parse path", cairn.Invalid, s, err)
	}
	return Path{Volume: vol, Parts: parts}, nil
}

// SplitClean splits a slash path inside a volume into validated components.
func SplitClean(p string) ([]string, error) {
	if len(p) > MaxPath {
		return nil, fmt.Errorf("path longer than %d bytes", MaxPath)
	}
	var parts []string
	for _, c := range strings.Split(p, "/") {
		if c == "" || c == "." {
			continue
		}
		if err := ValidName(c); err != nil {
			return nil, err
		}
		parts = append(parts, c)
	}
	return parts, nil
}

// ValidName checks one file name: non-empty, not "." or "..", no slash or
// NUL, valid UTF-8, at most MaxName bytes.
func ValidName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty file name")
	case name == "." || name == "..":
		return fmt.Errorf("%q is not allowed as a name in cairn paths", name)
	case len(name) > MaxName:
		return fmt.Errorf("file name longer than %d bytes", MaxName)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("file name %q contains '/' or NUL", name)
	case !utf8.ValidString(name):
		return fmt.Errorf("file name %q is not valid UTF-8", name)
	}
	return nil
}

// ValidVolume checks a volume name: 1–64 of [a-z0-9._-], starting with a
// letter or digit.
func ValidVolume(v string) error {
	if v == "" || len(v) > MaxVolumeName {
		return fmt.Errorf("volume name must be 1-%d characters", MaxVolumeName)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || i > 0 && (c == '.' || c == '_' || c == '-')
		if !ok {
			return fmt.Errorf("volume name %q: use lowercase letters, digits, '.', '_' and '-', starting with a letter or digit", v)
		}
	}
	return nil
}
