package cli_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cli"
)

// Two users on one realm: the owner shares one volume with bob, read-only;
// bob's device, which joined with no volume key, reads the shared volume
// through its grant (the owner's device serves the data, and only the data),
// cannot open a volume not shared with him, and loses the shared one when
// it is unshared.
func TestUsersShareVolume(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "awake", 5*time.Second)

	if out := a.ok("user", "add", "alice"); !strings.Contains(out, "owner") {
		t.Fatalf("first user: %s", out)
	}
	a.ok("user", "add", "bob")
	a.fails(cli.ExitExist, "user", "add", "bob")
	a.fails(cli.ExitUsage, "user", "add", "Bob!")
	ls := a.ok("user", "ls")
	if !strings.Contains(ls, "alice  owner") || !strings.Contains(ls, "bob    member") {
		t.Fatalf("user ls:\n%s", ls)
	}
	a.ok("volume", "create", "family")
	src := filepath.Join(t.TempDir(), "f.txt")
	writeFile(t, src, []byte("for the family\n"), 0o644)
	putJSON(t, a, src, "family:/")
	mine := filepath.Join(t.TempDir(), "mine.txt")
	writeFile(t, mine, []byte("alice's own\n"), 0o644)
	putJSON(t, a, mine, "home:/")
	a.fails(cli.ExitUsage, "share", "family", "bob")
	a.fails(cli.ExitNotFound, "share", "family", "carol", "--read")
	a.ok("share", "family", "bob", "--read")

	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "bobphone", "--user", "bob"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	if got := b.ok("cat", "family:/f.txt"); got != "for the family\n" {
		t.Fatalf("bob reads the shared volume: %q", got)
	}
	res := b.fails(cli.ExitPermission, "cat", "home:/mine.txt")
	if !strings.Contains(res.stderr, "not shared with user bob") {
		t.Fatalf("bob opens an unshared volume: %s", res.stderr)
	}
	// A member's device administers nothing.
	b.fails(cli.ExitPermission, "user", "add", "mallory")
	b.fails(cli.ExitPermission, "share", "home", "bob", "--read")

	a.ok("unshare", "family", "bob")
	a.fails(cli.ExitNotFound, "unshare", "family", "bob")
	if res := b.fails(cli.ExitPermission, "cat", "family:/f.txt"); !strings.Contains(res.stderr, "not shared with user bob") {
		t.Fatalf("bob reads an unshared volume: %s", res.stderr)
	}
	a.ok("share", "family", "bob", "--write")
	if got := b.ok("cat", "family:/f.txt"); got != "for the family\n" {
		t.Fatalf("bob reads the volume shared again: %q", got)
	}
	a.fails(cli.ExitPermission, "user", "remove", "alice")
	a.ok("user", "remove", "bob")
	b.fails(cli.ExitPermission, "cat", "family:/f.txt")
	if ls := a.ok("user", "ls"); strings.Contains(ls, "bob") {
		t.Fatalf("user ls after remove:\n%s", ls)
	}
}
