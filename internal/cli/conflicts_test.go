package cli_test

import (
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cli"
)

// TestConflictsCommand: 'cairn conflicts' on a realm with none lists
// none (a header; [] in JSON), and resolve says what is wrong with its
// command line or its path. (Conflicts themselves: meta's
// TestOfflineWritesReplay makes, lists and resolves them.)
func TestConflictsCommand(t *testing.T) {
	r := newRealm(t, "--no-passphrase")
	if got := r.ok("conflicts"); !strings.HasPrefix(got, "KIND") || strings.Count(got, "\n") != 1 {
		t.Fatalf("conflicts: %q", got)
	}
	if got := strings.TrimSpace(r.ok("conflicts", "--json")); got != "[]" {
		t.Fatalf("conflicts --json: %q", got)
	}
	if res := r.fails(cli.ExitUsage, "conflicts", "resolve", "home:/a"); !strings.Contains(res.stderr, "--keep mine|theirs|both is required") {
		t.Fatalf("resolve without --keep: %+v", res)
	}
	r.fails(cli.ExitUsage, "conflicts", "resolve", "home:/a", "--keep", "yours")
	if res := r.fails(cli.ExitNotFound, "conflicts", "resolve", "home:/a", "--keep", "mine"); !strings.Contains(res.stderr, "no conflict is recorded") {
		t.Fatalf("resolve of a path with no conflict: %+v", res)
	}
}
