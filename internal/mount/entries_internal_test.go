package mount

import (
	"testing"

	"cairn.dev/cairn/internal/meta"
)

// listed feeds c the whole listing of directory ino read at revision at,
// as readDir does once etcd has answered.
func (c *entryCache) listed(ino uint64, ents []meta.Entry, at int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	c.listedLocked(c.epoch, ino, ents, at)
	c.doneReadLocked()
}

func fileEnt(parent uint64, name string, ino uint64, rev int64) *meta.Entry {
	return &meta.Entry{Parent: parent, Name: name, Ino: ino, Type: meta.TypeFile, Mode: 0o644, Rev: rev}
}

func evPut(e *meta.Entry) meta.EntryChange {
	return meta.EntryChange{Parent: e.Parent, Name: e.Name, Entry: e, Rev: e.Rev}
}

func evDel(parent uint64, name string, rev int64) meta.EntryChange {
	return meta.EntryChange{Parent: parent, Name: name, Rev: rev}
}

// TestEntryCacheLateEvents: a change the watch reports after the cache
// read a newer state of its directory (the watch is behind the read)
// changes nothing. git creates .git/index.lock (revision 11) and renames
// it over .git/index (12); a listing of .git at 13 comes back before the
// watch reports either: the report of 11 must not make index.lock exist
// again until 12 is reported (git add's create of it failed with EEXIST,
// once, in TestProgramGit/write-back).
func TestEntryCacheLateEvents(t *testing.T) {
	const dir = 7
	c := newEntryCache(nil)
	c.established(9)
	index := fileEnt(dir, "index", 101, 12) // index.lock renamed over index
	again := fileEnt(dir, "again", 102, 12) // removed at 11, made again at 12
	c.listed(dir, []meta.Entry{*again, *index}, 13)

	check := func(when, name string, want *meta.Entry) {
		t.Helper()
		e, known := c.known(dir, name)
		switch {
		case !known:
			t.Fatalf("%s: the cache does not know %s of a complete directory", when, name)
		case want == nil && e != nil:
			t.Fatalf("%s: %s is there (inode %d, revision %d); it was gone when the directory was listed", when, name, e.Ino, e.Rev)
		case want != nil && e == nil:
			t.Fatalf("%s: %s is missing; the listing had it", when, name)
		case want != nil && (e.Ino != want.Ino || e.Rev != want.Rev):
			t.Fatalf("%s: %s is inode %d at revision %d, want %d at %d", when, name, e.Ino, e.Rev, want.Ino, want.Rev)
		}
	}

	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evPut(fileEnt(dir, "again", 90, 10))}, Rev: 10})
	check("after a late update", "again", again)
	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evDel(dir, "again", 11), evPut(fileEnt(dir, "index.lock", 100, 11))}, Rev: 11})
	check("after the late creation", "index.lock", nil)
	check("after the late removal", "again", again)
	check("after the late creation", "index", index)

	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{
		evDel(dir, "index.lock", 12), evPut(index), evPut(again),
	}, Rev: 12})
	check("once the watch caught up", "index.lock", nil)
	check("once the watch caught up", "index", index)
	check("once the watch caught up", "again", again)

	// What happens after the listing is applied.
	made := fileEnt(dir, "index.lock", 103, 14)
	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evPut(made)}, Rev: 14})
	check("after a creation newer than the listing", "index.lock", made)
	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evDel(dir, "index", 15)}, Rev: 15})
	check("after a removal newer than the listing", "index", nil)
}

// TestEntryCacheCompleteDuringWatch: a listing makes its directory
// complete although the watch reported a change in it while the read was
// in progress, when the change is at or before the listing's revision
// (the listing holds it), and not when it is after (the listing may lack
// it and the watch will not report it again).
func TestEntryCacheCompleteDuringWatch(t *testing.T) {
	for _, tc := range []struct {
		rev      int64
		complete bool
	}{{12, true}, {13, true}, {14, false}} {
		c := newEntryCache(nil)
		c.established(10)
		c.mu.Lock()
		c.reads++ // a read of the directory is in progress
		epoch := c.epoch
		c.mu.Unlock()
		f := fileEnt(7, "f", 100, tc.rev)
		c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evPut(f)}, Rev: tc.rev})
		var listing []meta.Entry
		if tc.rev <= 13 {
			listing = append(listing, *f)
		}
		c.mu.Lock()
		c.listedLocked(epoch, 7, listing, 13)
		c.doneReadLocked()
		c.mu.Unlock()
		if _, known := c.known(7, "g"); known != tc.complete {
			t.Errorf("a change at %d while a listing at 13 was read: complete %v, want %v", tc.rev, known, tc.complete)
		}
	}
}

// TestEntryCacheRemovedThenMadeAgain: a name this mount removes while a
// read is in flight, then makes again, cannot be kept (the read may
// return the removed entry), so the directory's cached listing must not
// answer that the name is absent: a lookup of a file just created would
// fail with ENOENT until the watch reported it.
func TestEntryCacheRemovedThenMadeAgain(t *testing.T) {
	const dir = 7
	c := newEntryCache(nil)
	c.established(9)
	c.listed(dir, []meta.Entry{*fileEnt(dir, "x", 101, 5), *fileEnt(dir, "y", 102, 5)}, 10)

	other := c.writing() // another operation's read or write in flight
	c.removed(dir, "x")  // unlink x
	if e, known := c.known(dir, "x"); !known || e != nil {
		t.Fatalf("after the unlink: x known %v, entry %v; want known absent", known, e)
	}
	ep := c.writing() // create x again
	c.wrote(ep, fileEnt(dir, "x", 103, 12), false)
	if e, known := c.known(dir, "x"); known && e == nil {
		t.Fatal("x, made again after its unlink, reads as absent from the directory's cached listing")
	}
	c.wrote(other, nil, false)
	if e, known := c.known(dir, "y"); known && (e == nil || e.Ino != 102) {
		t.Fatalf("y: %+v", e)
	}
}

// TestEntryCacheLateEventsAfterOwnRename: git writes .git/config through
// config.lock: made (revision 11), renamed over config (12) by this
// mount. When the watch reports the creation at 11 only after the rename
// (slow under -race), config.lock must not exist again: git's next
// create of it failed with "could not lock config file .git/config: File
// exists", once, in TestProgramGit/write-back under -race.
func TestEntryCacheLateEventsAfterOwnRename(t *testing.T) {
	const dir = 7
	c := newEntryCache(nil)
	c.established(9)
	c.listed(dir, []meta.Entry{*fileEnt(dir, "config", 100, 10)}, 10)
	absent := func(when, name string) {
		t.Helper()
		if e, known := c.known(dir, name); !known || e != nil {
			t.Fatalf("%s: %s known %v, entry %+v; want known absent", when, name, known, e)
		}
	}
	lock := fileEnt(dir, "config.lock", 101, 11)
	epoch := c.writing()
	c.wrote(epoch, lock, false)
	epoch = c.writing()
	c.renamed(epoch, dir, "config.lock", dir, "config", fileEnt(dir, "config", 101, 12))
	absent("after the rename", "config.lock")

	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evPut(lock)}, Rev: 11})
	absent("after the watch reported the lock's creation late", "config.lock")
	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evDel(dir, "config.lock", 12), evPut(fileEnt(dir, "config", 101, 12))}, Rev: 12})
	absent("once the watch caught up", "config.lock")
	if e, _ := c.known(dir, "config"); e == nil || e.Ino != 101 {
		t.Fatalf("config after the rename: %+v", e)
	}
	if len(c.gone) != 0 {
		t.Fatalf("names renamed away still remembered once the watch passed the rename: %v", c.gone)
	}
	// Made again later, and reported: there.
	again := fileEnt(dir, "config.lock", 102, 13)
	c.apply(meta.EntryEvents{Changes: []meta.EntryChange{evPut(again)}, Rev: 13})
	if e, _ := c.known(dir, "config.lock"); e == nil || e.Ino != 102 {
		t.Fatalf("config.lock made again at 13: %+v", e)
	}
}
