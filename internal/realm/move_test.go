package realm

import (
	"slices"
	"testing"

	"cairn.dev/cairn/internal/meta"
)

// The moves in progress are the offload entries marked with a move,
// grouped by volume, path and destination; a file is being moved by the
// move on its nearest ancestor (or itself).
func TestMovesOf(t *testing.T) {
	list := []*meta.Offload{
		{VolID: "v", Vol: "home", Move: "/a", Home: "desk", Now: "lap", Bytes: 10},
		{VolID: "v", Vol: "home", Move: "/a", Home: "desk", Now: "lap2", Bytes: 5},
		{VolID: "v", Vol: "home", Home: "desk", Now: "lap", Bytes: 7}, // an offload, no move
		{VolID: "v", Vol: "home", Move: "/a/b", Home: "s3", Now: "lap", Bytes: 1},
	}
	ms := movesOf(list)
	if len(ms) != 2 || ms[0].Path != "/a" || ms[0].To != "desk" || ms[0].Versions != 2 || ms[0].Bytes != 15 || !slices.Equal(ms[0].From, []string{"lap", "lap2"}) ||
		ms[1].Path != "/a/b" || ms[1].To != "s3" || ms[1].Versions != 1 {
		t.Fatalf("moves %+v", ms)
	}
	for path, want := range map[string]string{"/a": "desk", "/a/x": "desk", "/a/b": "s3", "/a/b/c": "s3", "/ab": "", "/": "", "/b": ""} {
		if got := MovingTo(ms, path); got != want {
			t.Errorf("MovingTo(%q) = %q, want %q", path, got, want)
		}
	}
	if got := MovingTo([]MoveStatus{{Path: "/", To: "x"}}, "/any/file"); got != "x" {
		t.Errorf("a move of the root: %q", got)
	}
}
