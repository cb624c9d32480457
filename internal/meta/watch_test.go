package meta_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// nextChanges reads watch responses until one carries changes.
func nextChanges(t *testing.T, w *meta.EntryWatch) meta.EntryEvents {
	t.Helper()
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if len(ev.Changes) > 0 {
			return ev
		}
	}
}

// TestWatchEntries: every change of a namespace record after the watch's
// start is reported once, in order, with where it lives; changes of other
// keys (locks, attributes, the trash) are not; a progress request is
// answered with a response without changes; Close ends Next.
func TestWatchEntries(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, v := newVol(t, 10)
	root := mustLookup(t, v)
	before := commit(t, s, v, root, "before", 1, 1)
	w, err := v.WatchEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if w.Start < before.Rev {
		t.Fatalf("watch starts at %d, before the last change (%d)", w.Start, before.Rev)
	}

	d, err := v.Create(ctx, root, meta.Entry{Name: "d", Type: meta.TypeDir, Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	ev := nextChanges(t, w)
	if len(ev.Changes) != 1 || ev.Changes[0].Parent != meta.RootIno || ev.Changes[0].Name != "d" ||
		ev.Changes[0].Entry == nil || ev.Changes[0].Entry.Ino != d.Ino || ev.Changes[0].Rev != d.Rev || ev.Rev < d.Rev {
		t.Fatalf("create: %+v", ev)
	}
	// A commit in d (its lock key is not reported, the entry is).
	f := commit(t, s, v, d, "f", 7, 2)
	ev = nextChanges(t, w)
	if len(ev.Changes) != 1 || ev.Changes[0].Parent != d.Ino || ev.Changes[0].Name != "f" || ev.Changes[0].Entry.Current().Size != 7 || ev.Changes[0].Rev != f.Rev {
		t.Fatalf("commit: %+v", ev)
	}
	// An attribute is not a namespace record.
	if serr := v.SetXattr(ctx, f.Ino, "user.x", []byte("1"), meta.XattrAny); serr != nil {
		t.Fatal(serr)
	}
	// Rename: a delete where it was, a put where it goes (one response).
	if rerr := v.Rename(ctx, d, "f", root, "g", "home:/g"); rerr != nil {
		t.Fatal(rerr)
	}
	ev = nextChanges(t, w)
	if len(ev.Changes) != 2 {
		t.Fatalf("rename: %+v", ev)
	}
	del, put := ev.Changes[0], ev.Changes[1]
	if del.Entry != nil || del.Parent != d.Ino || del.Name != "f" || put.Entry == nil || put.Parent != meta.RootIno || put.Name != "g" || put.Entry.Ino != f.Ino {
		t.Fatalf("rename changes: %+v / %+v", del, put)
	}
	// Remove to the trash: one delete (the trash record is not reported).
	if _, rerr := v.Remove(ctx, root, "g", "home:/g", false); rerr != nil {
		t.Fatal(rerr)
	}
	ev = nextChanges(t, w)
	if len(ev.Changes) != 1 || ev.Changes[0].Entry != nil || ev.Changes[0].Name != "g" {
		t.Fatalf("remove: %+v", ev)
	}
	// The root's own record.
	r := mustLookup(t, v)
	r.Mode = 0o700
	if _, uerr := v.Update(ctx, r); uerr != nil {
		t.Fatal(uerr)
	}
	ev = nextChanges(t, w)
	if c := ev.Changes[0]; c.Parent != 0 || c.Name != "" || c.Entry == nil || c.Entry.Ino != meta.RootIno || c.Entry.Mode != 0o700 {
		t.Fatalf("root update: %+v", c)
	}
	// Progress: a response without changes at the current revision.
	if rerr := w.RequestProgress(); rerr != nil {
		t.Fatal(rerr)
	}
	ev, err = w.Next()
	if err != nil || len(ev.Changes) != 0 || ev.Rev < r.Rev {
		t.Fatalf("progress: %+v, %v", ev, err)
	}
	// Close ends it.
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := w.Next(); err != nil {
				done <- err
				return
			}
		}
	}()
	w.Close()
	select {
	case err := <-done:
		if !errors.Is(err, cairn.ErrCanceled) {
			t.Fatalf("Next after Close = %v, want Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next did not return after Close")
	}
}
