package director

import (
	"errors"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
)

// The greedy plan takes the top W donors by free space that have room for
// a morsel, decrements the width when fewer have room, gives what one
// cannot take to the others, and refuses what they cannot take together.
func TestGreedyPlan(t *testing.T) {
	const m = 1 << 20
	donors := []meta.Donor{{Name: "big", Free: 10 * m}, {Name: "mid", Free: 6 * m}, {Name: "small", Free: 3 * m}, {Name: "full", Free: m / 2}}
	for _, c := range []struct {
		w    int
		size int64
		want map[string]int64
	}{
		{2, 8 * m, map[string]int64{"big": 4 * m, "mid": 4 * m}},
		{3, 9 * m, map[string]int64{"big": 3 * m, "mid": 3 * m, "small": 3 * m}},
		// Width 4 asked, three have room for a morsel: width 3.
		{4, 9 * m, map[string]int64{"big": 3 * m, "mid": 3 * m, "small": 3 * m}},
		// small takes 3 of its 5, the overflow goes to big then mid.
		{3, 15 * m, map[string]int64{"big": 7 * m, "mid": 5 * m, "small": 3 * m}},
	} {
		plan, err := GreedyPlan(donors, c.w, c.size, m)
		if err != nil {
			t.Fatalf("w=%d size=%d: %v", c.w, c.size, err)
		}
		if len(plan) != len(c.want) {
			t.Fatalf("w=%d size=%d: %v, want %v", c.w, c.size, plan, c.want)
		}
		for n, b := range c.want {
			if plan[n] != b {
				t.Fatalf("w=%d size=%d: %v, want %v", c.w, c.size, plan, c.want)
			}
		}
	}
	if _, err := GreedyPlan(donors, 2, 17*m, m); !errors.Is(err, meta.ErrNoRoom) || cairn.KindOf(err) != cairn.Permission {
		t.Fatalf("more than the top 2 hold: %v", err)
	}
	if _, err := GreedyPlan(donors[3:], 2, m/4, m); !errors.Is(err, meta.ErrNoRoom) {
		t.Fatalf("no donor with room for a morsel: %v", err)
	}
}

// Morsels go round-robin over the stripe set, in its order, each to a
// member whose reservation has room for it; a member whose reservation
// is used up is passed over.
func TestMorselRoundRobin(t *testing.T) {
	d := New(newEnv(), Options{})
	defer d.Close()
	ms := &morselSet{d: d, left: map[string]int64{"b2": 3, "b1": 2}, at: map[cairn.ID]int{}}
	for _, n := range []string{"b2", "b1"} {
		ms.members = append(ms.members, &member{name: n, d: d})
	}
	var got []string
	for range 6 {
		i := ms.pick(1)
		if i < 0 {
			got = append(got, "-")
			continue
		}
		got = append(got, ms.members[i].name)
	}
	if want := "b2 b1 b2 b1 b2 -"; strings.Join(got, " ") != want {
		t.Fatalf("placement %q, want %q", strings.Join(got, " "), want)
	}
}
