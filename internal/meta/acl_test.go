package meta_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
)

// actAs opens volume home of s's etcd as principal p would.
func actAs(t *testing.T, s *meta.Service, p meta.Principal) *meta.Vol {
	t.Helper()
	o, err := meta.New(s.Client(), meta.Options{LockTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	o.SetPrincipal(p)
	t.Cleanup(func() { o.Close() })
	v, err := o.Open(context.Background(), "home")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func names(es []meta.Entry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name)
	}
	return strings.Join(out, ",")
}

func wantPerm(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("%s: %v, want permission denied", what, err)
	}
}

// Owner, read-only member, stranger and a denied device: reads, listings
// and every kind of write are decided by the grants and the nearest ACL.
func TestACLDecides(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 2)
	pub := make([]byte, 32)
	for i, n := range []string{"alice", "bob", "carol"} {
		if err := s.AddUser(ctx, meta.UserRecord{Name: n, Public: pub, Owner: i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutGrant(ctx, v.V.ID, meta.GrantRecord{User: "bob", Access: meta.Read, Stanzas: [][]byte{{1}}}); err != nil {
		t.Fatal(err)
	}
	pubDir, _ := v.Create(ctx, root, meta.Entry{Name: "pub", Type: meta.TypeDir, Mode: 0o755})
	secret, _ := v.Create(ctx, pubDir, meta.Entry{Name: "secret", Type: meta.TypeDir, Mode: 0o755})
	shared, _ := v.Create(ctx, root, meta.Entry{Name: "shared", Type: meta.TypeDir, Mode: 0o755})
	commit(t, s, v, pubDir, "a", 1, 1)
	commit(t, s, v, secret, "s", 1, 2)
	_ = shared
	for _, a := range []struct{ path, who, perm string }{
		{"/shared", "user:bob", "rw"},
		{"/pub/secret", "user:bob", "none"},
		{"/pub/secret", "device:phone", "none"},
	} {
		if err := v.SetACL(ctx, a.path, a.who, meta.Perm(a.perm), "laptop"); err != nil {
			t.Fatal(err)
		}
	}
	gen, _ := s.WriteGen(ctx)
	cm := meta.Commit{Version: meta.Version{Size: 1}, Mode: 0o644, Gen: gen}

	// bob (shared --read): reads /pub but not /pub/secret, writes only
	// below /shared (inherited from its ACL, two levels down).
	bob := actAs(t, s, meta.Principal{User: "bob", Device: "bobpc"})
	broot, err := bob.Root(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if es, err := bob.ReadDir(ctx, broot.Ino); err != nil || names(es) != "pub,shared" {
		t.Fatalf("bob lists /: %q %v", names(es), err)
	}
	bpub := mustLookup(t, bob, "pub")
	if es, err := bob.ReadDir(ctx, bpub.Ino); err != nil || names(es) != "a" {
		t.Fatalf("bob lists /pub: %q %v (secret must be hidden)", names(es), err)
	}
	_, err = bob.Lookup(ctx, []string{"pub", "secret"})
	wantPerm(t, "bob looks up /pub/secret", err)
	_, err = bob.ReadDir(ctx, secret.Ino)
	wantPerm(t, "bob lists /pub/secret by its number", err)
	_, _, err = bob.CommitVersion(ctx, bpub, "b", cm)
	wantPerm(t, "bob writes /pub/b", err)
	_, err = bob.Create(ctx, bpub, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	wantPerm(t, "bob mkdir /pub/d", err)
	_, err = bob.Remove(ctx, bpub, "a", "/pub/a", false)
	wantPerm(t, "bob removes /pub/a", err)
	ba := mustLookup(t, bob, "pub", "a")
	ba.Mode = 0o600
	_, err = bob.Update(ctx, ba)
	wantPerm(t, "bob chmods /pub/a", err)
	bshared := mustLookup(t, bob, "shared")
	deep, err := bob.MkdirAll(ctx, []string{"shared", "x", "y"}, 0o755, 0, 0)
	if err != nil {
		t.Fatalf("bob mkdir -p /shared/x/y: %v", err)
	}
	if _, _, err = bob.CommitVersion(ctx, deep, "f", cm); err != nil {
		t.Fatalf("bob writes /shared/x/y/f: %v", err)
	}
	err = bob.Rename(ctx, bshared, "x", bpub, "x", "/pub/x")
	wantPerm(t, "bob moves /shared/x to /pub/x", err)
	err = bob.Rename(ctx, broot, "pub", bshared, "pub", "/shared/pub")
	wantPerm(t, "bob moves /pub into /shared", err)
	if _, err = bob.Remove(ctx, bshared, "x", "home:/shared/x", true); err != nil {
		t.Fatalf("bob removes /shared/x: %v", err)
	}
	// The trash: bob sees what he may read, and cannot put back a file
	// of a denied path in one he may write.
	gone, err := v.Remove(ctx, secret, "s", "home:/pub/secret/s", false)
	if err != nil {
		t.Fatal(err)
	}
	if tr, err := bob.Trash(ctx); err != nil || len(tr) != 1 || tr[0].Path != "home:/shared/x" {
		t.Fatalf("bob's trash: %+v %v", tr, err)
	}
	_, err = bob.RestoreTrash(ctx, gone.ID, bshared, "s")
	wantPerm(t, "bob restores /pub/secret/s into /shared", err)
	if _, err = v.RestoreTrash(ctx, gone.ID, secret, "s"); err != nil {
		t.Fatal(err)
	}

	// carol: not shared, no ACL: nothing.
	carol := actAs(t, s, meta.Principal{User: "carol", Device: "carolpc"})
	_, err = carol.Root(ctx)
	wantPerm(t, "carol reads /", err)
	_, _, err = carol.CommitVersion(ctx, root, "c", cm)
	wantPerm(t, "carol writes /c", err)

	// alice's laptop: everything; alice's phone: not /pub/secret.
	laptop := actAs(t, s, meta.Principal{User: "alice", Device: "laptop"})
	if _, err = laptop.Lookup(ctx, []string{"pub", "secret", "s"}); err != nil {
		t.Fatalf("alice's laptop reads /pub/secret/s: %v", err)
	}
	phone := actAs(t, s, meta.Principal{User: "alice", Device: "phone"})
	ppub := mustLookup(t, phone, "pub")
	if es, err := phone.ReadDir(ctx, ppub.Ino); err != nil || names(es) != "a" {
		t.Fatalf("phone lists /pub: %q %v", names(es), err)
	}
	_, err = phone.Lookup(ctx, []string{"pub", "secret", "s"})
	wantPerm(t, "phone reads /pub/secret/s", err)
	if _, _, err = phone.CommitVersion(ctx, ppub, "p", cm); err != nil {
		t.Fatalf("phone writes /pub/p: %v", err)
	}

	// Removing bob's entry on /shared gives him his grant again (read).
	if err = v.RemoveACL(ctx, "/shared", "user:bob"); err != nil {
		t.Fatal(err)
	}
	_, _, err = bob.CommitVersion(ctx, bshared, "g", cm)
	wantPerm(t, "bob writes /shared/g after the ACL's removal", err)
	if err = v.RemoveACL(ctx, "/shared", "user:bob"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("removing it twice: %v", err)
	}
}

// An ACL change that lands between a write's decision and its commit
// fails the commit's transaction: the write is decided again, and refused.
func TestACLRaceDecidedAgain(t *testing.T) {
	ctx := context.Background()
	s, v, root := newVolRoot(t, 2)
	pub := make([]byte, 32)
	for i, n := range []string{"alice", "bob"} {
		if err := s.AddUser(ctx, meta.UserRecord{Name: n, Public: pub, Owner: i == 0}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutGrant(ctx, v.V.ID, meta.GrantRecord{User: "bob", Access: meta.Write, Stanzas: [][]byte{{1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	bob := actAs(t, s, meta.Principal{User: "bob", Device: "bobpc"})
	bd := mustLookup(t, bob, "d")
	gen, _ := s.WriteGen(ctx)
	for _, op := range []string{"commit", "create"} {
		raced := false
		done := meta.SetTestHookACLDecided(func(string, string) {
			if !raced {
				raced = true
				if err := v.SetACL(ctx, "/d", "user:bob", meta.PermRead, "laptop"); err != nil {
					t.Error(err)
				}
			}
		})
		var err error
		if op == "commit" {
			_, _, err = bob.CommitVersion(ctx, bd, "f", meta.Commit{Version: meta.Version{Size: 1}, Mode: 0o644, Gen: gen})
		} else {
			_, err = bob.Create(ctx, bd, meta.Entry{Name: "g", Type: meta.TypeDir, Mode: 0o755})
		}
		done()
		wantPerm(t, op+" raced by an ACL change", err)
		if !raced {
			t.Fatal("the hook did not run")
		}
		if es, _ := v.ReadDir(ctx, bd.Ino); len(es) != 0 {
			t.Fatalf("%s: %q written despite the ACL", op, names(es))
		}
		if err := v.RemoveACL(ctx, "/d", "user:bob"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestACLRecordChecks(t *testing.T) {
	ctx := context.Background()
	_, v := newVol(t, 1)
	for _, c := range []struct{ path, who, perm string }{
		{"pub", "user:bob", "r"}, {"/pub/", "user:bob", "r"}, {"/a/../b", "user:bob", "r"},
		{"/pub", "bob", "r"}, {"/pub", "user:Bob", "r"}, {"/pub", "group:x", "r"}, {"/pub", "user:bob", "w"},
	} {
		if err := v.SetACL(ctx, c.path, c.who, meta.Perm(c.perm), "x"); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("SetACL(%q, %q, %q) = %v, want Invalid", c.path, c.who, c.perm, err)
		}
	}
}

func FuzzDecodeACL(f *testing.F) {
	f.Add([]byte(`{"format":1,"path":"/a/b","entries":[{"who":"user:bob","perm":"r","set":1,"set_by":"laptop"}]}`))
	f.Add([]byte(`{"format":1,"path":"/","entries":[{"who":"device:phone","perm":"none","set":1}]}`))
	f.Add([]byte(`{"format":2,"path":"/","entries":[]}`))
	f.Add([]byte(`{"format":1,"path":"//","entries":[{"who":"user:a","perm":"rw"},{"who":"user:a","perm":"r"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := meta.DecodeACL(b)
		if err != nil {
			if cairn.KindOf(err) != cairn.Corrupt {
				t.Fatalf("error of kind %v: %v", cairn.KindOf(err), err)
			}
			return
		}
		if _, err := meta.CleanACLPath(r.Path); err != nil || len(r.Entries) == 0 {
			t.Fatalf("accepted a bad record: %+v", r)
		}
		seen := map[string]bool{}
		for _, e := range r.Entries {
			if meta.CheckPrincipal(e.Who) != nil || seen[e.Who] {
				t.Fatalf("accepted a bad entry: %+v", e)
			}
			seen[e.Who] = true
			if _, err := meta.ParsePerm(string(e.Perm)); err != nil {
				t.Fatalf("accepted a bad perm: %+v", e)
			}
		}
	})
}

// BenchmarkCreateACL: what deciding by the ACLs costs a create (one more
// etcd read per write), without and with a principal.
func BenchmarkCreateACL(b *testing.B) {
	ctx := context.Background()
	for _, withP := range []bool{false, true} {
		name := "no-principal"
		if withP {
			name = "principal"
		}
		b.Run(name, func(b *testing.B) {
			s, err := meta.New(etcdtest.New(b), meta.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if err := s.InitRealm(ctx, meta.RealmInfo{ID: "r1", Format: 1}); err != nil {
				b.Fatal(err)
			}
			if err := s.CreateVolume(ctx, meta.Volume{Name: "home", KeepVersions: 1, TrashTTL: time.Hour}, 0o755, 0, 0); err != nil {
				b.Fatal(err)
			}
			if err := s.AddUser(ctx, meta.UserRecord{Name: "alice", Public: make([]byte, 32), Owner: true}); err != nil {
				b.Fatal(err)
			}
			if withP {
				s.SetPrincipal(meta.Principal{User: "alice", Device: "laptop"})
			}
			v, err := s.Open(ctx, "home")
			if err != nil {
				b.Fatal(err)
			}
			root, err := v.Root(ctx)
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := v.Create(ctx, root, meta.Entry{Name: fmt.Sprintf("f%d", i), Type: meta.TypeFile, Mode: 0o644}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
