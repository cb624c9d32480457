package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// `cairn meta move`: the metadata service moves from the first device to
// another, and both reach it afterwards with no edit of their config; it
// is refused without --to and on a device that does not host it.
func TestMetaMoveCommand(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	a.waitState("desk", "online", 5*time.Second)
	src := filepath.Join(t.TempDir(), "d.txt")
	writeFile(t, src, []byte("written before the move\n"), 0o644)
	putJSON(t, a, src, "home:/before")

	tok := strings.TrimSpace(a.ok("invite", "--role", "device", "--name", "laptop"))
	b := joiner(t)
	b.ok("join", tok, "--no-passphrase")
	b.serveOn("127.0.0.2:0", "2s")
	a.waitState("laptop", "online", 5*time.Second)

	if out := b.ok("devices"); !strings.Contains(out, "metadata: desk (leader, gateway ") {
		t.Fatalf("devices before the move: %s", out)
	}
	if res := a.run("meta", "move"); res.code == 0 || !strings.Contains(res.stderr, "--to") {
		t.Fatalf("meta move without --to: %+v", res)
	}
	if res := b.run("meta", "move", "--to", "desk"); res.code == 0 || !strings.Contains(res.stderr, "does not host") {
		t.Fatalf("meta move on a device that does not host it: %+v", res)
	}
	if out := a.ok("meta", "move", "--to", "laptop"); !strings.Contains(out, "moved the metadata service to laptop") {
		t.Fatalf("meta move: %q", out)
	}
	var cfg struct {
		Etcd    []string `json:"etcd"`
		Gateway []string `json:"gateway"`
	}
	raw, err := os.ReadFile(filepath.Join(a.home, "realm.json"))
	if err != nil || json.Unmarshal(raw, &cfg) != nil || len(cfg.Gateway) != 1 {
		t.Fatalf("desk's realm.json after the move: %s %v", raw, err)
	}
	for _, r := range []*realmT{a, b} {
		if got := r.ok("cat", "home:/before/d.txt"); got != "written before the move\n" {
			t.Fatalf("cat after the move: %q", got)
		}
	}
	for _, r := range []*realmT{a, b} {
		if out := r.ok("devices"); !strings.Contains(out, "metadata: laptop (leader, gateway 127.0.0.2:") {
			t.Fatalf("devices after the move: %s", out)
		}
	}
	putJSON(t, b, src, "home:/after")
	if out := a.ok("ls", "home:/"); out != "after/\nbefore/\n" {
		t.Fatalf("ls on desk after the move: %q", out)
	}
}
