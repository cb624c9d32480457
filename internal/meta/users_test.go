package meta_test

import (
	"context"
	"errors"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// One owner per realm; grants only for existing users; a rotation is all
// or nothing and refuses a stale view of the grants.
func TestUsersGrantsRotate(t *testing.T) {
	ctx := context.Background()
	s, v := newVol(t, 1)
	pub := make([]byte, 32)
	if err := s.AddUser(ctx, meta.UserRecord{Name: "Alice", Public: pub}); !errors.Is(err, cairn.ErrInvalid) {
		t.Fatalf("bad name: %v", err)
	}
	if err := s.AddUser(ctx, meta.UserRecord{Name: "alice", Public: pub, Owner: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddUser(ctx, meta.UserRecord{Name: "eve", Public: pub, Owner: true}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("a second owner: %v", err)
	}
	for _, n := range []string{"bob", "carol"} {
		if err := s.AddUser(ctx, meta.UserRecord{Name: n, Public: pub}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddUser(ctx, meta.UserRecord{Name: "bob", Public: pub}); !errors.Is(err, cairn.ErrExist) {
		t.Fatalf("bob twice: %v", err)
	}
	if us, err := s.Users(ctx); err != nil || len(us) != 3 || !us[0].Owner || us[1].Owner {
		t.Fatalf("users: %+v %v", us, err)
	}
	volID := v.V.ID
	st := [][]byte{[]byte("s0")}
	if err := s.PutGrant(ctx, volID, meta.GrantRecord{User: "dave", Access: meta.Read, Stanzas: st}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("grant to no one: %v", err)
	}
	for _, n := range []string{"bob", "carol"} {
		if err := s.PutGrant(ctx, volID, meta.GrantRecord{User: n, Access: meta.Read, Stanzas: st}); err != nil {
			t.Fatal(err)
		}
	}
	gs, revs, err := s.GrantsRev(ctx, volID)
	if err != nil || len(gs) != 2 {
		t.Fatalf("grants: %+v %v", gs, err)
	}
	carol := gs[1]
	carol.Stanzas = [][]byte{[]byte("s0"), []byte("s1")}
	// Carol's grant changes after it was read: the rotation is refused
	// and nothing of it is written.
	if err = s.PutGrant(ctx, volID, meta.GrantRecord{User: "carol", Access: meta.Write, Stanzas: st}); err != nil {
		t.Fatal(err)
	}
	if err = s.Rotate(ctx, volID, "bob", 1, []byte("k1"), []meta.GrantRecord{carol}, revs[1:]); !errors.Is(err, cairn.ErrConflict) {
		t.Fatalf("rotate on a stale view: %v", err)
	}
	if ks, _ := s.EpochKeys(ctx, volID); len(ks) != 0 {
		t.Fatalf("a refused rotation left epochs %q", ks)
	}
	if _, err = s.Grant(ctx, volID, "bob"); err != nil {
		t.Fatalf("a refused rotation removed bob's grant: %v", err)
	}
	gs, revs, _ = s.GrantsRev(ctx, volID)
	carol = gs[1]
	carol.Stanzas = [][]byte{[]byte("s0"), []byte("s1")}
	if err = s.Rotate(ctx, volID, "bob", 1, []byte("k1"), []meta.GrantRecord{carol}, revs[1:]); err != nil {
		t.Fatal(err)
	}
	if _, err = s.Grant(ctx, volID, "bob"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("bob's grant after the rotation: %v", err)
	}
	if g, gerr := s.Grant(ctx, volID, "carol"); gerr != nil || len(g.Stanzas) != 2 {
		t.Fatalf("carol's grant after the rotation: %+v %v", g, gerr)
	}
	if ks, kerr := s.EpochKeys(ctx, volID); kerr != nil || len(ks) != 1 || string(ks[0]) != "k1" {
		t.Fatalf("epochs: %q %v", ks, kerr)
	}
	if err = s.RemoveUser(ctx, "alice"); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("remove the owner: %v", err)
	}
	if err = s.RemoveUser(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	if gs, _ := s.Grants(ctx, volID); len(gs) != 0 {
		t.Fatalf("grants of a removed user remain: %+v", gs)
	}
}

// FuzzDecodeGrant: a grant record from the metadata never panics the
// decoder, and what it accepts has a known access and a stanza.
func FuzzDecodeGrant(f *testing.F) {
	f.Add([]byte(`{"format":1,"user":"bob","access":"read","stanzas":["AQID"],"granted":1}`))
	f.Add([]byte(`{"format":2}`))
	f.Add([]byte(`{"format":1,"access":"write","stanzas":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := meta.DecodeGrant(b)
		if err != nil {
			if k := cairn.KindOf(err); k != cairn.Corrupt {
				t.Fatalf("kind %v: %v", k, err)
			}
			return
		}
		if (g.Access != meta.Read && g.Access != meta.Write) || len(g.Stanzas) == 0 || g.Format != meta.UserRecordFormat {
			t.Fatalf("accepted %+v", g)
		}
	})
}
