package mount_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/mount"
)

// TestCheckAllowOther: another user than root may mount with AllowOther
// only if the FUSE configuration has a user_allow_other line as
// fusermount3 reads it; elsewise the error says what to add, and where.
func TestCheckAllowOther(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, conf string
		ok         bool
		says       string
	}{
		{"missing", "", false, "no such file"},
		{"empty", "\n", false, "add it"},
		{"alone", "user_allow_other\n", true, ""},
		{"among others", "# fuse.conf\nmount_max = 1000\n\nuser_allow_other\n", true, ""},
		{"blanks and comment", "  \tuser_allow_other   # for cairn\n", true, ""},
		{"commented out", "#user_allow_other\n", false, "add it"},
		{"comment before it", "# user_allow_other\n", false, "add it"},
		{"other word", "user_allow_other_x\n", false, "add it"},
		{"no newline", "mount_max = 10\nuser_allow_other", false, "no newline"},
		{"unreadable", "dir", false, "add it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			switch c.name {
			case "missing":
			case "unreadable":
				if err := os.Mkdir(p, 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				if err := os.WriteFile(p, []byte(c.conf), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := mount.CheckAllowOtherUser(p)
			if c.ok {
				if err != nil {
					t.Fatalf("%q: %v", c.conf, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%q: allowed", c.conf)
			}
			if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), p) ||
				!strings.Contains(err.Error(), "user_allow_other") || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("%q: %v: want a permission error naming %s and user_allow_other, saying %q", c.conf, err, p, c.says)
			}
		})
	}
	if os.Geteuid() == 0 {
		if err := mount.CheckAllowOther(filepath.Join(dir, "missing")); err != nil {
			t.Fatalf("as root: %v", err)
		}
	}
}
