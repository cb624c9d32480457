package docs

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"cairn.dev/cairn/internal/metrics"
)

// TestMetricsDoc checks that doc/metrics.md lists exactly the registered
// cairn_ metrics, each with its labels, so the doc cannot drift.
func TestMetricsDoc(t *testing.T) {
	b, err := os.ReadFile("../../doc/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	// Rows: | `name` | type | `l1`, `l2` | meaning |
	row := regexp.MustCompile("(?m)^\\| `(cairn_[a-z_]+)` \\| ([a-z]+) \\|([^|]*)\\|")
	doc := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(b), -1) {
		if _, dup := doc[m[1]]; dup {
			t.Errorf("doc/metrics.md lists %s twice", m[1])
		}
		doc[m[1]] = labelList(m[3])
	}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	vl := regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
	code := map[string]string{}
	for _, d := range metrics.New().Descs() {
		s := d.String()
		n, l := fq.FindStringSubmatch(s), vl.FindStringSubmatch(s)
		if n == nil || l == nil {
			t.Fatalf("cannot read the description %s", s)
		}
		code[n[1]] = labelList(l[1])
	}
	if len(code) < 10 {
		t.Fatalf("only %d metrics registered: %v", len(code), code)
	}
	for n, l := range code {
		dl, ok := doc[n]
		switch {
		case !ok:
			t.Errorf("metric %s (labels %q) is not in doc/metrics.md", n, l)
		case dl != l:
			t.Errorf("metric %s: doc/metrics.md gives labels %q, the code %q", n, dl, l)
		}
	}
	for n := range doc {
		if _, ok := code[n]; !ok {
			t.Errorf("doc/metrics.md lists %s, which is not registered", n)
		}
	}
}

// labelList normalises "`a`, `b`" and "a,b" to "a,b" (sorted).
func labelList(s string) string {
	var ls []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '`' }) {
		ls = append(ls, f)
	}
	slices.Sort(ls)
	return strings.Join(ls, ",")
}

// TestGrafanaDashboard checks that doc/grafana-cairn.json is JSON, that
// every cairn_ name its queries use is registered, and that it shows every
// registered metric.
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../doc/grafana-cairn.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("doc/grafana-cairn.json: %v", err)
	}
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	registered := map[string]bool{}
	for _, desc := range metrics.New().Descs() {
		registered[fq.FindStringSubmatch(desc.String())[1]] = true
	}
	name := regexp.MustCompile(`cairn_[a-z_]+`)
	used := map[string]bool{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				if !registered[n] {
					for _, suf := range []string{"_bucket", "_sum", "_count"} {
						if registered[strings.TrimSuffix(n, suf)] {
							n = strings.TrimSuffix(n, suf)
						}
					}
				}
				if !registered[n] {
					t.Errorf("panel %q queries %s, which is not registered", p.Title, n)
				}
				used[n] = true
			}
		}
	}
	for n := range registered {
		if !used[n] {
			t.Errorf("the dashboard shows no panel of %s", n)
		}
	}
}
