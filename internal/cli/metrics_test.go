package cli_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"cairn.dev/cairn/internal/cli"
)

var metricsLine = regexp.MustCompile(`cairn: metrics on (http://\S+/metrics)`)

// metricsURL waits until out shows where the process serves its metrics.
func metricsURL(t *testing.T, out *outBuf, p *proc) string {
	t.Helper()
	var url string
	waitFor(t, "the metrics address on stderr", 30*time.Second, func() bool {
		select {
		case <-p.done:
			t.Fatalf("exited before serving metrics: %v\n%s", p.err, out.String())
		default:
		}
		if m := metricsLine.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
		}
		return url != ""
	})
	return url
}

// scrapeMetrics fetches url and parses it with Prometheus' text parser.
// ok is false if the process could not be reached (it has exited).
func scrapeMetrics(t *testing.T, url string) (fams map[string]*dto.MetricFamily, ok bool) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err = p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the text parser refuses %s: %v", url, err)
	}
	return fams, true
}

// sample sums family name's counters, gauges or histogram counts whose
// labels include want.
func sample(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	var v float64
next:
	for _, m := range fams[name].GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			found := false
			for _, l := range m.GetLabel() {
				found = found || l.GetName() == want[i] && l.GetValue() == want[i+1]
			}
			if !found {
				continue next
			}
		}
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
	}
	return v
}

// startOut starts a cairn command with its output collected.
func (r *realmT) startOut(args ...string) (*proc, *outBuf) {
	r.t.Helper()
	cmd := r.command(args...)
	cmd.Env = r.env
	var out outBuf
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &proc{done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	return p, &out
}

// TestMetricsDuringPut is issue 23's acceptance: a put serves /metrics
// (--metrics 127.0.0.1:0), the text parser reads it, and the local
// store's bytes and requests grow between two scrapes during the put.
func TestMetricsDuringPut(t *testing.T) {
	r := newRealm(t)
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	// Many files, one at a time: each is a commit (etcd round trips),
	// so the put lasts long enough to be scraped twice.
	for i := range 300 {
		writeFile(t, filepath.Join(src, fmt.Sprintf("f%03d", i)), randBytes(64<<10), 0o644)
	}
	p, out := r.startOut("put", "--workers", "1", "--metrics", "127.0.0.1:0", src, "home:/")
	url := metricsURL(t, out, p)
	written := func(f map[string]*dto.MetricFamily) float64 {
		return sample(f, "cairn_store_written_bytes_total", "store", "local")
	}
	puts := func(f map[string]*dto.MetricFamily) float64 {
		return sample(f, "cairn_store_requests_total", "store", "local", "op", "put", "result", "ok")
	}
	var first map[string]*dto.MetricFamily
	waitFor(t, "a scrape showing the put's first bytes", 60*time.Second, func() bool {
		f, ok := scrapeMetrics(t, url)
		if !ok {
			t.Fatalf("the put exited before it wrote anything it counted\n%s", out.String())
		}
		if written(f) > 0 {
			first = f
		}
		return first != nil
	})
	moved := false
	for !moved {
		f, ok := scrapeMetrics(t, url)
		if !ok {
			break // the put has ended
		}
		if written(f) > written(first) && puts(f) > puts(first) {
			moved = true
			// Opening the realm and the volume took etcd round trips;
			// the commits come in groups, maybe only at the end (the
			// mount's test counts a commit).
			if sample(f, "cairn_etcd_requests_total", "result", "ok") == 0 {
				t.Errorf("no etcd round trip counted during the put")
			}
		}
	}
	if !moved {
		t.Fatalf("the local store's bytes and requests did not grow between two scrapes during the put (first: %v bytes)\n%s", written(first), out.String())
	}
	<-p.done
	if p.err != nil {
		t.Fatalf("put: %v\n%s", p.err, out.String())
	}
}

// TestMetricsNodeAndMount: node serve and mount serve /metrics when asked,
// on loopback only, and count their work.
func TestMetricsNodeAndMount(t *testing.T) {
	r := newRealm(t)
	if res := r.fails(cli.ExitUsage, "node", "serve", "--listen", "127.0.0.1:0", "--metrics", "0.0.0.0:0"); !strings.Contains(res.stderr, "loopback") {
		t.Errorf("a public metrics address: %s", res.stderr)
	}
	p, out := r.startOut("node", "serve", "--listen", "127.0.0.1:0", "--lease", "5s", "--metrics", "127.0.0.1:0")
	url := metricsURL(t, out, p)
	waitFor(t, "the node's etcd round trips in its metrics", 30*time.Second, func() bool {
		f, ok := scrapeMetrics(t, url)
		if !ok {
			t.Fatalf("node serve exited\n%s", out.String())
		}
		return sample(f, "cairn_etcd_requests_total", "result", "ok") > 0
	})

	if os.Geteuid() != 0 {
		t.Skip("the mount's part needs root (FUSE)")
	}
	mnt := t.TempDir()
	_, mp, mout := r.foregroundWith(mnt, nil, "--mode", "blocking", "--metrics", "127.0.0.1:0")
	murl := metricsURL(t, mout, mp)
	writeFile(t, filepath.Join(mnt, "a"), randBytes(100<<10), 0o644)
	f, ok := scrapeMetrics(t, murl)
	if !ok {
		t.Fatalf("the mount's metrics are gone\n%s", mout.String())
	}
	if sample(f, "cairn_commit_duration_seconds", "result", "ok") < 1 || sample(f, "cairn_store_written_bytes_total", "store", "local") < 100<<10 {
		t.Errorf("a blocking mount's close committed 100KiB, its metrics do not show it")
	}
	if f["cairn_mount_commit_queue_length"] == nil {
		t.Errorf("no commit queue gauge")
	}
	r.ok("umount", mnt)
}
