package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestManPages: `cairn man DIR` writes one page per command a user can
// run, each naming the command and saying what it does, and every
// command has that one-line summary (a page or a help line without it is
// a command nobody can find).
func TestManPages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "man1")
	var out bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &out, wakeTimeout: -1}
	root := e.rootCmd()
	root.SetArgs([]string{"man", dir})
	if err := root.Execute(); err != nil {
		t.Fatalf("cairn man: %v\n%s", err, out.String())
	}
	want := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if !c.IsAvailableCommand() && c != root {
			return
		}
		if strings.TrimSpace(c.Short) == "" {
			t.Errorf("%q has no one-line summary (Short)", c.CommandPath())
		}
		want++
		page := filepath.Join(dir, strings.ReplaceAll(c.CommandPath(), " ", "-")+".1")
		b, err := os.ReadFile(page)
		if err != nil {
			t.Errorf("no manual page for %q: %v", c.CommandPath(), err)
		} else {
			s := string(b)
			title := strings.ToUpper(strings.ReplaceAll(c.CommandPath(), " ", "-"))
			if !strings.Contains(s, `.TH "`+title+`" "1"`) {
				t.Errorf("%s: no .TH header for %s:\n%.200s", page, title, s)
			}
			first := strings.Fields(c.Short + " -")[0]
			if !strings.Contains(s, ".SH NAME") || !strings.Contains(s, first) {
				t.Errorf("%s: no NAME section with %q", page, c.Short)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	if len(pages) != want || want < 40 {
		t.Errorf("%d pages for %d commands", len(pages), want)
	}
	if !strings.Contains(out.String(), "manual pages to "+dir) {
		t.Errorf("output %q does not say where the pages went", out.String())
	}
}
