package dav_test

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// litmusSuites are the litmus suites the gateway must pass in full. Each
// runs separately: litmus stops at the first suite that fails.
var litmusSuites = []string{"basic", "copymove", "props", "locks", "http"}

var litmusSummary = regexp.MustCompile(`<- summary for ` + "`" + `(\w+)': of (\d+) tests run: (\d+) passed, (\d+) failed`)

// TestLitmus runs Debian's litmus WebDAV conformance suites against a
// gateway on 127.0.0.1 (plain HTTP: loopback) and fails on any failed
// test. Counts are logged (bench/RESULTS.md records them).
func TestLitmus(t *testing.T) {
	bin, err := exec.LookPath("litmus")
	if err != nil {
		t.Skip("litmus is not installed (Debian package litmus; scripts/test-deps.sh installs it)")
	}
	f := newFixture(t)
	for _, suite := range litmusSuites {
		t.Run(suite, func(t *testing.T) {
			cmd := exec.Command(bin, f.srv.URL+"/", f.user, f.pass)
			cmd.Env = append(os.Environ(), "TESTS="+suite)
			cmd.Dir = t.TempDir() // litmus writes debug.log there
			start := time.Now()
			out, err := cmd.CombinedOutput()
			m := litmusSummary.FindStringSubmatch(string(out))
			if m == nil || m[1] != suite {
				t.Fatalf("litmus %s: no summary (exit: %v)\n%s", suite, err, out)
			}
			run, _ := strconv.Atoi(m[2])
			passed, _ := strconv.Atoi(m[3])
			failed, _ := strconv.Atoi(m[4])
			warnings := strings.Count(string(out), "WARNING")
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "WARNING") {
					t.Logf("litmus %s: %s", suite, strings.TrimSpace(line))
				}
			}
			t.Logf("litmus %s: %d tests run, %d passed, %d failed, %d warnings (%v)", suite, run, passed, failed, warnings, time.Since(start).Round(time.Millisecond))
			if failed != 0 || passed != run || run == 0 || err != nil {
				t.Errorf("litmus %s failed (exit: %v):\n%s", suite, err, out)
			}
		})
	}
}
