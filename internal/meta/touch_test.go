package meta_test

import (
	"context"
	"testing"
	"time"

	"cairn.dev/cairn/internal/meta"
)

// TestTouchParent: a parent given with Touch has its mtime and ctime
// advanced by a create, a removal, a rename (both parents) and a
// PutBatch, in the change's transaction; one whose record changed since
// it was read keeps its times and does not fail the change; one given
// without Touch keeps them.
func TestTouchParent(t *testing.T) {
	ctx := context.Background()
	_, v, root := newVolRoot(t, 10)
	mk := func(name string) *meta.Entry {
		t.Helper()
		d, err := v.Create(ctx, root, meta.Entry{Name: name, Type: meta.TypeDir, Mode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	get := func(d *meta.Entry) *meta.Entry {
		t.Helper()
		e, err := v.Get(ctx, d.Parent, d.Name)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	// touched returns d's record to touch, and a copy of it as it was.
	touched := func(d *meta.Entry) (*meta.Entry, *meta.Entry) {
		e := get(d)
		before := *e
		e.Touch = true
		return e, &before
	}
	// kept checks that the touched entry p now is d's record as written.
	kept := func(p, d *meta.Entry) {
		t.Helper()
		now := get(d)
		if p.Rev != now.Rev || p.Mtime != now.Mtime || p.Ctime != now.Ctime {
			t.Fatalf("%s: touched entry rev %d mtime %d ctime %d, record %d %d %d", d.Name, p.Rev, p.Mtime, p.Ctime, now.Rev, now.Mtime, now.Ctime)
		}
	}
	a, b := mk("a"), mk("b")
	// advanced reports whether d's times moved past before's, both.
	advanced := func(before, d *meta.Entry) bool {
		t.Helper()
		now := get(d)
		if (now.Mtime > before.Mtime) != (now.Ctime > before.Ctime) {
			t.Fatalf("%s: mtime %d -> %d but ctime %d -> %d", d.Name, before.Mtime, now.Mtime, before.Ctime, now.Ctime)
		}
		return now.Mtime > before.Mtime
	}
	step := func() { time.Sleep(2 * time.Millisecond) } // clock granularity

	step()
	pa, was := touched(a)
	if _, err := v.Create(ctx, pa, meta.Entry{Name: "f", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if !advanced(was, a) {
		t.Fatal("create did not advance its parent's times")
	}
	kept(pa, a)

	// Untouched: a parent given as callers always did.
	step()
	pa = get(a)
	if _, err := v.Create(ctx, pa, meta.Entry{Name: "g", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	if advanced(pa, a) {
		t.Fatal("create advanced the times of a parent given without Touch")
	}

	// Stale: the record changed since it was read.
	step()
	stale, _ := touched(a)
	cur := get(a)
	cur.Mode = 0o700
	if _, err := v.Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	cur = get(a)
	step()
	if _, err := v.Create(ctx, stale, meta.Entry{Name: "h", Type: meta.TypeFile, Mode: 0o644}); err != nil {
		t.Fatalf("create with a stale parent to touch: %v", err)
	}
	if advanced(cur, a) {
		t.Fatal("a stale parent's record was written")
	}
	if get(a).Mode != 0o700 {
		t.Fatal("a stale parent's record was written back")
	}
	if stale.Rev == get(a).Rev {
		t.Fatal("a stale parent's entry was updated as if written")
	}

	step()
	pa, was = touched(a)
	if _, err := v.Remove(ctx, pa, "h", "v:/a/h", false); err != nil {
		t.Fatal(err)
	}
	if !advanced(was, a) {
		t.Fatal("remove did not advance its parent's times")
	}
	kept(pa, a)

	step()
	pa, wasA := touched(a)
	pb, wasB := touched(b)
	if err := v.Rename(ctx, pa, "f", pb, "f", "v:/b/f"); err != nil {
		t.Fatal(err)
	}
	if !advanced(wasA, a) || !advanced(wasB, b) {
		t.Fatal("rename did not advance both parents' times")
	}
	kept(pa, a)
	kept(pb, b)

	step()
	pb, wasB = touched(b)
	if err := v.Rename(ctx, pb, "f", pb, "f2", "v:/b/f2"); err != nil {
		t.Fatal(err)
	}
	kept(pb, b)
	if !advanced(wasB, b) {
		t.Fatal("rename within a directory did not advance its times")
	}

	step()
	pb, wasB = touched(b)
	// The time of the entries' making (write-back: when the mount made
	// them), not of the batch.
	made := time.Now().UnixNano()
	puts := []meta.BatchPut{
		{Entry: meta.Entry{Name: "x", Parent: b.Ino, Ino: meta.NewIno(), Type: meta.TypeFile, Mode: 0o644, Mtime: made, Ctime: made}, Dir: *pb},
		{Entry: meta.Entry{Name: "y", Parent: b.Ino, Ino: meta.NewIno(), Type: meta.TypeFile, Mode: 0o644, Mtime: made - 1, Ctime: made - 1}, Dir: *pb},
	}
	if _, err := v.PutBatch(ctx, puts); err != nil {
		t.Fatal(err)
	}
	kept(&puts[0].Dir, b)
	if !advanced(wasB, b) {
		t.Fatal("PutBatch did not advance its directory's times")
	}
	if e := get(b); e.Mtime != made || e.Ctime != made {
		t.Fatalf("PutBatch gave its directory mtime %d ctime %d, not its newest entry's making %d", e.Mtime, e.Ctime, made)
	}
}
