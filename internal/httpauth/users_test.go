package httpauth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable/durabletest"
)

func TestUsers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dav", "passwd.json")
	u := OpenUsers(path)
	if n, err := u.Count(); err != nil || n != 0 {
		t.Fatalf("Count of no file = %d, %v", n, err)
	}
	pass, err := u.Add("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(pass) < 26 {
		t.Fatalf("password %q is short", pass)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file: %v, mode %v; want 0600", err, fi.Mode())
	}
	b, _ := os.ReadFile(path)
	if strings.Contains(string(b), pass) || !strings.Contains(string(b), "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("users file holds the password or no argon2id hash:\n%s", b)
	}
	if _, aerr := u.Add("alice", false); !errors.Is(aerr, cairn.ErrExist) {
		t.Fatalf("adding an existing user: %v", aerr)
	}
	for _, bad := range []string{"", "a:b", "a b", strings.Repeat("x", 65), "é"} {
		if _, aerr := u.Add(bad, false); !errors.Is(aerr, cairn.ErrInvalid) {
			t.Errorf("Add(%q): %v, want Invalid", bad, aerr)
		}
	}
	for _, c := range []struct {
		user, pass string
		want       bool
	}{{"alice", pass, true}, {"alice", pass, true}, {"alice", pass + "x", false}, {"bob", pass, false}, {"alice", "", false}} {
		if ok, verr := u.Verify(c.user, c.pass); verr != nil || ok != c.want {
			t.Errorf("Verify(%s, %q) = %v, %v; want %v", c.user, c.pass, ok, verr, c.want)
		}
	}
	// A new password replaces the old one, also in a verifier that
	// remembered the old one (another process changed the file).
	other := OpenUsers(path)
	pass2, err := other.Add("alice", true)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := u.Verify("alice", pass); ok {
		t.Error("the replaced password still works")
	}
	if ok, _ := u.Verify("alice", pass2); !ok {
		t.Error("the new password does not work")
	}
	if _, aerr := u.Add("bob", false); aerr != nil {
		t.Fatal(aerr)
	}
	list, err := u.List()
	if err != nil || len(list) != 2 || list[0].Name != "alice" || list[1].Name != "bob" || list[0].Created.IsZero() {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if err := u.Remove("bob"); err != nil {
		t.Fatal(err)
	}
	if err := u.Remove("bob"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("removing an absent user: %v", err)
	}
	if n, _ := u.Count(); n != 1 {
		t.Fatalf("Count = %d after removing bob", n)
	}

	// A damaged file is an error, not an open door.
	os.WriteFile(path, []byte("{not json"), 0o600)
	if ok, err := u.Verify("alice", pass2); ok || !errors.Is(err, cairn.ErrCorrupt) {
		t.Fatalf("Verify with a damaged file = %v, %v", ok, err)
	}
}

func TestCheckPassword(t *testing.T) {
	h := hashPassword("secret")
	if ok, err := checkPassword(h, "secret"); !ok || err != nil {
		t.Fatalf("checkPassword(right) = %v, %v", ok, err)
	}
	if ok, err := checkPassword(h, "Secret"); ok || err != nil {
		t.Fatalf("checkPassword(wrong) = %v, %v", ok, err)
	}
	f := strings.Split(h, "$")
	for _, bad := range []string{
		"", "$argon2i$v=19$m=19456,t=2,p=1$" + f[4] + "$" + f[5],
		"$argon2id$v=19$m=99999999,t=2,p=1$" + f[4] + "$" + f[5], // a hostile memory cost
		"$argon2id$v=19$m=19456,t=2,p=1$!!$" + f[5],
		"$argon2id$v=19$m=19456,t=2,p=1$" + f[4] + "$AAAA",
	} {
		if _, err := checkPassword(bad, "secret"); err == nil {
			t.Errorf("checkPassword accepted the hash %q", bad)
		}
	}
}

// TestUsersFullDisk adds a user on a full file system: Add must fail and
// the password file written before must still hold its users (a lost
// write error once renamed an empty file over it and reported success).
func TestUsersFullDisk(t *testing.T) {
	dir := durabletest.SmallTmpfs(t)
	path := filepath.Join(dir, "dav", "passwd.json")
	u := OpenUsers(path)
	pass, err := u.Add("alice", false)
	if err != nil {
		t.Fatal(err)
	}
	durabletest.Fill(t, dir)
	if _, err = u.Add("bob", false); !errors.Is(err, cairn.ErrIO) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Add on a full disk = %v, want an IO error wrapping ENOSPC", err)
	}
	u2 := OpenUsers(path)
	if ok, verr := u2.Verify("alice", pass); verr != nil || !ok {
		t.Fatalf("Verify(alice) after the failed Add = %v, %v; want the user saved before", ok, verr)
	}
	if n, cerr := u2.Count(); cerr != nil || n != 1 {
		t.Fatalf("Count = %d, %v; want 1", n, cerr)
	}
}
