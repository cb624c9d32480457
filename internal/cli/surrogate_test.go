package cli_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/cli"
	"cairn.dev/cairn/internal/pipeline"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
	"cairn.dev/cairn/internal/surrogate"
)

// A surrogate joins, serves its staging API with --offer; a device adds it
// (measured) and lists it; a device's session stages a chunk and reads it
// back; the surrogate's disk holds no plaintext; a restart of the
// surrogate deletes what was staged.
func TestSurrogateServeAddStage(t *testing.T) {
	a := newRealm(t, "--no-passphrase", "--name", "desk")
	a.serve("2s")
	tok := strings.TrimSpace(a.ok("invite", "--role", "surrogate", "--name", "cafe"))
	sur := joiner(t)
	sur.ok("join", tok)
	sur.fails(cli.ExitUsage, "node", "serve", "--listen", "127.0.0.1:0", "--staging-lease", "5s")
	sur.fails(cli.ExitUsage, "node", "serve", "--listen", "127.0.0.1:0", "--offer", "lots")
	a.fails(cli.ExitUsage, "node", "serve", "--listen", "127.0.0.1:0", "--offer", "1GiB")
	cs := sur.serveWith("2s", "--offer", "8MiB", "--staging-lease", "1m")

	if out := a.ok("surrogate", "ls"); !strings.Contains(out, "no surrogate") {
		t.Fatalf("ls before add: %s", out)
	}
	if out := a.ok("surrogate", "add", cs.addr); !strings.Contains(out, "added surrogate "+cs.addr+" (cafe)") || !strings.Contains(out, "offers 8.0M, quota 2.0M") {
		t.Fatalf("add: %s", out)
	}
	var rows []map[string]any
	if err := json.Unmarshal([]byte(a.ok("surrogate", "ls", "--json")), &rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0]["addr"] != cs.addr || rows[0]["name"] != "cafe" || rows[0]["reachable"] != true ||
		rows[0]["rtt_ns"].(float64) <= 0 || rows[0]["up_bps"].(float64) <= 0 || rows[0]["down_bps"].(float64) <= 0 ||
		rows[0]["offer"].(float64) != 8<<20 || rows[0]["lease_ms"].(float64) != 60000 {
		t.Fatalf("ls --json: %v", rows)
	}
	if out := a.ok("surrogate", "ls"); !strings.Contains(out, cs.addr) || !strings.Contains(out, "cafe") {
		t.Fatalf("ls: %s", out)
	}
	a.fails(cli.ExitUsage, "surrogate", "add", "no-port")

	// A device's session stages a real chunk and reads it back.
	creds, err := pki.LoadCredentials(realm.CredentialsDir(a.home))
	if err != nil {
		t.Fatal(err)
	}
	tlsConf, err := surrogate.ClientTLS(creds, pki.NoRevocations{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := surrogate.NewClient(cs.addr, tlsConf)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := t.Context()
	s, err := c.Register(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	plain := bytes.Repeat([]byte("thesis/chapter-3.tex: a secret sentence of sixty-four bytes.... "), 100)
	ref, stored := pipeline.EncodeChunk([32]byte{7}, plain)
	if _, err := s.Stage(ctx, []surrogate.Object{{ID: ref.ID, Data: stored}}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := pipeline.DecodeChunk(ref, got); err != nil || !bytes.Equal(p, plain) {
		t.Fatalf("decode: %v", err)
	}
	// Nothing of the plaintext on the surrogate's disk.
	filepath.Walk(sur.home, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, plain[:64]) || bytes.Contains(b, []byte("chapter-3")) {
			t.Errorf("%s holds plaintext", p)
		}
		return nil
	})
	staged := filepath.Join(realm.StagingDir(sur.home), s.ID().String(), ref.ID.String())
	if _, err := os.Stat(staged); err != nil {
		t.Fatal(err)
	}

	// A restart deletes what was staged; the old session is gone.
	cs.stop(t)
	cs = sur.serveOn(cs.addr, "2s", "--offer", "8MiB")
	if _, err := os.Stat(staged); !os.IsNotExist(err) {
		t.Fatalf("after a restart the staged chunk is still there: %v", err)
	}
	if _, err := s.Get(ctx, ref.ID); cairn.KindOf(err) != cairn.Permission {
		t.Fatalf("old session after a restart: %v", err)
	}
	a.ok("surrogate", "remove", cs.addr)
	a.fails(cli.ExitNotFound, "surrogate", "remove", cs.addr)
	if out := a.ok("surrogate", "ls"); !strings.Contains(out, "no surrogate") {
		t.Fatalf("ls after remove: %s", out)
	}
}
