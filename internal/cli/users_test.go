package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/cli"
	cmeta "cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/realm"
)

// Two users on one realm: the owner shares one volume with bob, read-only;
// bob's device, which joined with no volume key, reads the shared volume
// through its grant (the owner's device serves the data, and only the data),
// cannot open a volume not shared with him, and loses the shared one when
// it is unshared: the volume's key is rotated, so what is written after
// does not open even with the keys bob had, while carol, still a member,
// reads old and new.
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
	// Bob's keyring is sealed by his passphrase: his private key is not
	// on his disk in the clear.
	b := joiner(t)
	b.env = append(b.env, "CAIRN_PASSPHRASE=bob's passphrase")
	if out := b.ok("join", tok); !strings.Contains(out, "belongs to user bob") {
		t.Fatalf("join as bob's device: %s", out)
	}
	if kr, err := os.ReadFile(filepath.Join(b.home, "keyring")); err != nil || !strings.Contains(string(kr), `"protection": "passphrase"`) || strings.Contains(string(kr), "user:bob") {
		t.Fatalf("bob's keyring: %s %v", kr, err)
	}
	if res := b.runEnv([]string{"CAIRN_PASSPHRASE=wrong"}, "cat", "family:/f.txt"); res.code != cli.ExitPermission {
		t.Fatalf("bob's device with a wrong passphrase: %+v", res)
	}
	if got := b.ok("cat", "family:/f.txt"); got != "for the family\n" {
		t.Fatalf("bob reads the shared volume: %q", got)
	}
	ls = a.ok("user", "ls")
	rows := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(ls), "\n")[1:] {
		f := strings.Fields(l)
		rows[f[0]] = f
	}
	// USER ROLE ADDED(date time) DEVICES KEY
	if len(rows["alice"]) != 6 || rows["alice"][4] != "desk" || len(rows["bob"]) != 6 || rows["bob"][4] != "bobphone" {
		t.Fatalf("user ls: each user's devices:\n%s", ls)
	}
	res := b.fails(cli.ExitPermission, "cat", "home:/mine.txt")
	if !strings.Contains(res.stderr, "not shared with user bob") {
		t.Fatalf("bob opens an unshared volume: %s", res.stderr)
	}
	// A member's device administers nothing.
	b.fails(cli.ExitPermission, "user", "add", "mallory")
	b.fails(cli.ExitPermission, "share", "home", "bob", "--read")
	if res := b.fails(cli.ExitPermission, "volume", "create", "bobs"); !strings.Contains(res.stderr, "does not own the realm") {
		t.Fatalf("a member's device makes a volume: %s", res.stderr)
	}

	// carol, a second member, keeps the volume through bob's unshare.
	a.ok("user", "add", "carol")
	a.ok("share", "family", "carol", "--read")
	tok = strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "carolpc", "--user", "carol"))
	c := joiner(t)
	c.ok("join", tok, "--no-passphrase")

	// A bob who keeps the keys his grant gave him (here: a volume opened
	// in this process before the unshare, holding them in memory).
	ctx := context.Background()
	br, err := realm.Open(ctx, b.home, realm.Options{Passphrase: func() ([]byte, error) { return []byte("bob's passphrase"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	kept, err := br.Volume(ctx, "family")
	if err != nil {
		t.Fatal(err)
	}

	a.ok("unshare", "family", "bob")
	a.fails(cli.ExitNotFound, "unshare", "family", "bob")
	if res := b.fails(cli.ExitPermission, "cat", "family:/f.txt"); !strings.Contains(res.stderr, "not shared with user bob") {
		t.Fatalf("bob reads an unshared volume: %s", res.stderr)
	}
	after := filepath.Join(t.TempDir(), "after.txt")
	writeFile(t, after, []byte("written after bob left\n"), 0o644)
	putJSON(t, a, after, "family:/")
	if got := c.ok("cat", "family:/after.txt"); got != "written after bob left\n" {
		t.Fatalf("carol reads what was written after the rotation: %q", got)
	}
	if got := c.ok("cat", "family:/f.txt"); got != "for the family\n" {
		t.Fatalf("carol reads what was written before the rotation: %q", got)
	}
	if got := a.ok("cat", "family:/after.txt"); got != "written after bob left\n" {
		t.Fatalf("alice reads after the rotation: %q", got)
	}
	// With the old keys: what was written before opens, what was written
	// after does not.
	// bob's cairn refuses him the volume's names now (no grant: no
	// access); a device reading etcd directly is not held by that.
	raw, err := cmeta.New(br.Meta.Client(), cmeta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rawVol, err := raw.Open(ctx, "family")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kept.Meta.Lookup(ctx, []string{"f.txt"}); cairn.KindOf(err) != cairn.Permission {
		t.Fatalf("bob's cairn looks up a name of a volume no longer shared with him: %v", err)
	}
	readKept := func(name string) (string, error) {
		e, err := rawVol.Lookup(ctx, []string{name})
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		err = kept.ReadFile(ctx, e, nil, &buf)
		return buf.String(), err
	}
	if got, err := readKept("f.txt"); err != nil || got != "for the family\n" {
		t.Fatalf("old data with the old keys: %q %v", got, err)
	}
	if got, err := readKept("after.txt"); err == nil || cairn.KindOf(err) != cairn.Permission {
		t.Fatalf("new data with the old keys: %q %v (want a permission error)", got, err)
	}

	a.ok("share", "family", "bob", "--write")
	if got := b.ok("cat", "family:/after.txt"); got != "written after bob left\n" {
		t.Fatalf("bob reads the volume shared again: %q", got)
	}
	a.fails(cli.ExitPermission, "user", "remove", "alice")
	a.ok("user", "remove", "bob")
	b.fails(cli.ExitPermission, "cat", "family:/f.txt")
	if ls := a.ok("user", "ls"); strings.Contains(ls, "bob") {
		t.Fatalf("user ls after remove:\n%s", ls)
	}
}
