package journal

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
)

var ctx = context.Background()

func open(t testing.TB, dir string, size int64) *Journal {
	t.Helper()
	j, err := Open(ctx, dir, Options{SegmentSize: size})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return j
}

func payload(id int) []byte {
	return []byte(fmt.Sprintf("id=%d;%s", id, strings.Repeat(string(rune('a'+id%26)), id%97)))
}

// checkPayload reports whether p is payload(id) for the id it names.
func checkPayload(p []byte) (int, bool) {
	s, _, ok := strings.Cut(strings.TrimPrefix(string(p), "id="), ";")
	id, err := strconv.Atoi(s)
	if !ok || err != nil || !strings.HasPrefix(string(p), "id=") {
		return 0, false
	}
	return id, bytes.Equal(p, payload(id))
}

func seqsOf(recs []Record) []uint64 {
	var s []uint64
	for _, r := range recs {
		s = append(s, r.Seq)
	}
	return s
}

func TestAppendAckReopen(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	var seqs []uint64
	for i := 0; i < 10; i++ {
		s, err := j.Append(ctx, payload(i))
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	// Out of order.
	if err := j.Ack(ctx, seqs[7], seqs[2], seqs[2], 9999); err != nil {
		t.Fatal(err)
	}
	if err := j.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	j.Close()
	j = open(t, dir, 0)
	defer j.Close()
	recs := j.Pending()
	if len(recs) != 8 {
		t.Fatalf("pending %v", seqsOf(recs))
	}
	for i, r := range recs {
		id, ok := checkPayload(r.Payload)
		if !ok || (i > 0 && r.Seq <= recs[i-1].Seq) || id == 2 || id == 7 {
			t.Fatalf("record %d: seq %d %q", i, r.Seq, r.Payload)
		}
	}
	s, err := j.Append(ctx, payload(10))
	if err != nil || s <= seqs[9] {
		t.Fatalf("append after reopen: seq %d (last %d) %v", s, seqs[9], err)
	}
}

// Rotation carries pending records forward and removes old segments;
// sequence numbers keep growing once every record is acked and every
// old segment gone.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 512)
	keep, _ := j.Append(ctx, payload(1)) // never acked: pins the first segment
	var last uint64
	for i := 2; i < 200; i++ {
		s, err := j.Append(ctx, payload(i))
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Ack(ctx, s); err != nil {
			t.Fatal(err)
		}
		last = s
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+ext))
	if len(segs) > 2 {
		t.Fatalf("%d segments left: rotation removes the old ones", len(segs))
	}
	j.Close()
	j = open(t, dir, 512)
	if got := seqsOf(j.Pending()); len(got) != 1 || got[0] != keep {
		t.Fatalf("pending after reopen: %v, want [%d]", got, keep)
	}
	j.Ack(ctx, keep)
	j.Close()
	j = open(t, dir, 512)
	defer j.Close()
	if s, _ := j.Append(ctx, payload(0)); s <= last {
		t.Fatalf("seq %d after %d: reused", s, last)
	}
}

func lastSegment(t testing.TB, dir string) string {
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+ext))
	if len(segs) == 0 {
		t.Fatal("no segment")
	}
	return segs[len(segs)-1]
}

// A tail torn at every byte of the last frame is cut away; the records
// before it stay, and the journal takes records again.
func TestTornTail(t *testing.T) {
	base := t.TempDir()
	j := open(t, base, 0)
	for i := 0; i < 3; i++ {
		j.Append(ctx, payload(i))
	}
	j.Close()
	full, _ := os.ReadFile(lastSegment(t, base))
	lastLen := int64(frameHead + 9 + len(payload(2)))
	for cut := int64(1); cut < lastLen; cut++ {
		dir := t.TempDir()
		p := filepath.Join(dir, filepath.Base(lastSegment(t, base)))
		os.WriteFile(p, full[:int64(len(full))-cut], 0o600)
		j := open(t, dir, 0)
		if d := j.Damage(); len(d) != 0 {
			t.Fatalf("cut %d: a torn tail is not damage: %v", cut, d)
		}
		recs := j.Pending()
		if len(recs) != 2 {
			t.Fatalf("cut %d: pending %v", cut, seqsOf(recs))
		}
		s, err := j.Append(ctx, payload(9))
		j.Close()
		if err != nil {
			t.Fatal(err)
		}
		j = open(t, dir, 0)
		if got := seqsOf(j.Pending()); len(got) != 3 || got[2] != s {
			t.Fatalf("cut %d: after an append: %v", cut, got)
		}
		j.Close()
	}
}

// A bit flipped in a middle record: the records before and after it are
// kept, the damage is reported as Corrupt, and the segment is kept aside.
func TestBitFlipMiddle(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 0)
	for i := 0; i < 5; i++ {
		j.Append(ctx, payload(i))
	}
	j.Close()
	p := lastSegment(t, dir)
	b, _ := os.ReadFile(p)
	_, frames, _, _, _ := Decode(b)
	b[frames[2].Off+frameHead+12] ^= 0x10 // in record 2's payload
	os.WriteFile(p, b, 0o600)
	j = open(t, dir, 0)
	defer j.Close()
	d := j.Damage()
	if len(d) != 1 || !errors.Is(d[0], cairn.ErrCorrupt) {
		t.Fatalf("damage: %v", d)
	}
	var ids []int
	for _, r := range j.Pending() {
		id, ok := checkPayload(r.Payload)
		if !ok {
			t.Fatalf("a record that fails its check: %q", r.Payload)
		}
		ids = append(ids, id)
	}
	if fmt.Sprint(ids) != "[0 1 3 4]" {
		t.Fatalf("records kept: %v", ids)
	}
	if _, err := os.Stat(p + ".corrupt"); err != nil {
		t.Fatalf("the damaged segment is not kept aside: %v", err)
	}
	j.Close()
	// Reopened: nothing damaged any more, the same records.
	j = open(t, dir, 0)
	if len(j.Damage()) != 0 || len(j.Pending()) != 4 {
		t.Fatalf("second open: damage %v, pending %d", j.Damage(), len(j.Pending()))
	}
}

// A bit flipped in the last record of a segment that a rotation closed
// is damage too (it was fsynced whole), not a torn tail.
func TestBitFlipClosedSegment(t *testing.T) {
	dir := t.TempDir()
	j := open(t, dir, 300)
	for i := 0; i < 20; i++ {
		j.Append(ctx, payload(i))
	}
	j.Close()
	segs, _ := filepath.Glob(filepath.Join(dir, "*"+ext))
	if len(segs) < 2 {
		t.Fatalf("%d segments", len(segs))
	}
	b, _ := os.ReadFile(segs[0])
	b[len(b)-2] ^= 1
	os.WriteFile(segs[0], b, 0o600)
	j = open(t, dir, 300)
	defer j.Close()
	if d := j.Damage(); len(d) != 1 || !errors.Is(d[0], cairn.ErrCorrupt) {
		t.Fatalf("damage: %v", d)
	}
	if n := len(j.Pending()); n != 19 {
		t.Fatalf("%d pending, want 19", n)
	}
}

func FuzzJournalDecode(f *testing.F) {
	dir := f.TempDir()
	j := open(f, dir, 0)
	for i := 0; i < 4; i++ {
		s, _ := j.Append(ctx, payload(i))
		if i == 1 {
			j.Ack(ctx, s)
		}
	}
	j.Close()
	b, _ := os.ReadFile(lastSegment(f, dir))
	f.Add(b)
	f.Add(b[:len(b)-3])
	f.Add(header(7))
	f.Add([]byte("cairnj"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, good, resumed, err := Decode(b)
		if err != nil {
			return
		}
		if good > int64(len(b)) || (len(resumed) > 0 && resumed[0] <= good) {
			t.Fatalf("good %d, resumed %v, len %d", good, resumed, len(b))
		}
		// Opening it as a journal never fails or panics, and a second
		// open finds the same records and no damage.
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "0000000000000000"+ext), b, 0o600)
		j, err := Open(ctx, dir, Options{})
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		first := j.Pending()
		if _, aerr := j.Append(ctx, []byte("x")); aerr != nil {
			t.Fatalf("append: %v", aerr)
		}
		j.Close()
		j, err = Open(ctx, dir, Options{})
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer j.Close()
		if len(j.Damage()) != 0 {
			t.Fatalf("damage at the second open: %v", j.Damage())
		}
		again := j.Pending()
		if len(again) != len(first)+1 {
			t.Fatalf("%d records, then %d", len(first), len(again))
		}
		for i := range first {
			if first[i].Seq != again[i].Seq || !bytes.Equal(first[i].Payload, again[i].Payload) {
				t.Fatalf("record %d differs at the second open", i)
			}
		}
	})
}

// The crash test's child: appends, acks and syncs at random in
// $CAIRN_JOURNAL_CRASH_DIR, reporting each step on stdout after it
// returned, until killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("CAIRN_JOURNAL_CRASH_DIR"); dir != "" {
		crashChild(dir)
		return
	}
	os.Exit(m.Run())
}

func crashChild(dir string) {
	j, err := Open(ctx, dir, Options{SegmentSize: 4096})
	if err != nil {
		fmt.Println("E", err)
		os.Exit(1)
	}
	id, _ := strconv.Atoi(os.Getenv("CAIRN_JOURNAL_CRASH_ID"))
	out := bufio.NewWriter(os.Stdout)
	var live []uint64
	for _, r := range j.Pending() {
		live = append(live, r.Seq)
	}
	for {
		switch r := rand.IntN(10); {
		case r < 6:
			s, err := j.Append(ctx, payload(id))
			if err != nil {
				fmt.Fprintln(out, "E", err)
				out.Flush()
				os.Exit(1)
			}
			fmt.Fprintln(out, "A", s, id)
			id++
			live = append(live, s)
		case r < 8 && len(live) > 0:
			k := rand.IntN(len(live))
			s := live[k]
			live = append(live[:k], live[k+1:]...)
			fmt.Fprintln(out, "K", s) // before: an ack may have landed
			out.Flush()
			if err := j.Ack(ctx, s); err != nil {
				os.Exit(1)
			}
		default:
			out.Flush()
			if err := j.Sync(ctx); err != nil {
				os.Exit(1)
			}
			fmt.Fprintln(out, "S")
		}
		out.Flush()
	}
}

// TestCrash runs the child and SIGKILLs it at random points, many times
// over the same directory: every record whose Append returned before a
// Sync that returned, and that was never acked, is there, intact, in
// order; nothing else half-there. CAIRN_TEST_JOURNAL_KILLS sets the
// number of kills (default 20).
func TestCrash(t *testing.T) {
	kills := 20
	if s := os.Getenv("CAIRN_TEST_JOURNAL_KILLS"); s != "" {
		kills, _ = strconv.Atoi(s)
	}
	dir := t.TempDir()
	durableSeq := map[uint64]int{} // seq -> id: appended before a sync returned
	acked := map[uint64]bool{}
	nextID := 0
	for k := 0; k < kills; k++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "CAIRN_JOURNAL_CRASH_DIR="+dir, fmt.Sprintf("CAIRN_JOURNAL_CRASH_ID=%d", nextID))
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(40_000)) * time.Microsecond)
		syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		var unsynced []struct {
			seq uint64
			id  int
		}
		for _, line := range strings.Split(out.String(), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "E":
				t.Fatalf("child: %s", line)
			case "A":
				if len(f) != 3 {
					continue // cut by the kill
				}
				s, _ := strconv.ParseUint(f[1], 10, 64)
				id, _ := strconv.Atoi(f[2])
				unsynced = append(unsynced, struct {
					seq uint64
					id  int
				}{s, id})
				nextID = id + 1
			case "K":
				if len(f) == 2 {
					s, _ := strconv.ParseUint(f[1], 10, 64)
					acked[s] = true
				}
			case "S":
				for _, u := range unsynced {
					durableSeq[u.seq] = u.id
				}
				unsynced = nil
			}
		}
		nextID += 1000 // ids the kill cut off unreported are not reused
		j := open(t, dir, 4096)
		if d := j.Damage(); len(d) != 0 {
			t.Fatalf("kill %d: damage after a kill: %v", k, d)
		}
		got := map[uint64]int{}
		var prev uint64
		for _, r := range j.Pending() {
			id, ok := checkPayload(r.Payload)
			if !ok || r.Seq <= prev {
				t.Fatalf("kill %d: record %d: %q (after %d)", k, r.Seq, r.Payload, prev)
			}
			prev = r.Seq
			got[r.Seq] = id
		}
		for s, id := range durableSeq {
			if acked[s] {
				continue
			}
			if gid, ok := got[s]; !ok || gid != id {
				t.Fatalf("kill %d: record %d (id %d), synced and never acked, is gone (have %v)", k, s, id, ok)
			}
		}
		j.Close()
	}
}
