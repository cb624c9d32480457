package metrics_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/metrics"
	"cairn.dev/cairn/internal/store"
	"cairn.dev/cairn/internal/store/localstore"
	"cairn.dev/cairn/internal/store/memstore"
)

// scrape fetches url and parses it with Prometheus' text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// value returns the sum of family name's samples whose labels include want.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var v float64
next:
	for _, m := range f.GetMetric() {
		for k, w := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == w {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			v += m.Counter.GetValue()
		case m.Gauge != nil:
			v += m.Gauge.GetValue()
		case m.Histogram != nil:
			v += float64(m.Histogram.GetSampleCount())
		}
	}
	return v
}

func TestServeAndStoreWrapper(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := metrics.New()
	addr, err := m.Serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + addr + "/metrics"
	st := m.WrapStore("mem", memstore.New())
	if _, ok := st.(store.Verifier); ok {
		t.Fatal("a memstore wrapper claims abilities memstore lacks")
	}
	data := []byte("some bytes of a chunk")
	id := cairn.ID(blake3.Sum256(data))
	before := scrape(t, url)
	if err := st.Put(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, cairn.ID{1}); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("get of a missing object: %v", err)
	}
	after := scrape(t, url)
	mem := map[string]string{"store": "mem"}
	for _, c := range []struct {
		name  string
		label map[string]string
		delta float64
	}{
		{"cairn_store_written_bytes_total", mem, float64(len(data))},
		{"cairn_store_read_bytes_total", mem, float64(len(data))},
		{"cairn_store_requests_total", map[string]string{"store": "mem", "op": "put", "result": "ok"}, 1},
		{"cairn_store_requests_total", map[string]string{"store": "mem", "op": "get", "result": "ok"}, 1},
		{"cairn_store_requests_total", map[string]string{"store": "mem", "op": "get", "result": "not_found"}, 1},
		{"cairn_store_request_duration_seconds", map[string]string{"store": "mem", "op": "get"}, 2},
	} {
		if d := value(after, c.name, c.label) - value(before, c.name, c.label); d != c.delta {
			t.Errorf("%s%v moved by %v, want %v", c.name, c.label, d, c.delta)
		}
	}
	if after["go_goroutines"] == nil || after["process_cpu_seconds_total"] == nil {
		t.Error("the Go and process collectors are missing")
	}
}

func TestLocalStoreKeepsAbilities(t *testing.T) {
	ctx := context.Background()
	ls, err := localstore.Open(ctx, t.TempDir(), localstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := metrics.New().WrapStore("local", ls)
	defer st.Close()
	for what, ok := range map[string]bool{
		"StoreStats": is[cairn.StoreStats](st), "Verifier": is[store.Verifier](st), "Compacter": is[store.Compacter](st),
		"Refresher": is[store.Refresher](st), "Checker": is[store.Checker](st), "Quarantiner": is[store.Quarantiner](st),
	} {
		if !ok {
			t.Errorf("the wrapped local store lost %s", what)
		}
	}
	data := []byte("x")
	if err := st.Put(ctx, cairn.ID(blake3.Sum256(data)), data); err != nil {
		t.Fatal(err)
	}
	u, err := st.(cairn.StoreStats).Stats(ctx)
	if err != nil || u.Objects != 1 {
		t.Fatalf("stats through the wrapper: %+v, %v", u, err)
	}
}

func is[T any](v any) bool { _, ok := v.(T); return ok }

func TestLoopbackOnly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, a := range []string{"0.0.0.0:0", ":0", "192.0.2.1:9464", "example.com:80"} {
		if _, err := metrics.New().Serve(ctx, a); !errors.Is(err, cairn.ErrInvalid) {
			t.Errorf("Serve(%q) = %v, want a refusal of Kind Invalid", a, err)
		}
	}
	for _, a := range []string{"127.0.0.1:0", "[::1]:0", "localhost:0"} {
		if _, err := metrics.New().Serve(ctx, a); err != nil && !strings.Contains(err.Error(), "address") {
			t.Errorf("Serve(%q): %v", a, err)
		}
	}
}

// TestPromlint checks every metric's name, unit and help with promlint,
// each metric given a sample so that it appears.
func TestPromlint(t *testing.T) {
	m := metrics.New()
	m.StoreRequests.WithLabelValues("local", "get", "ok").Inc()
	m.StoreDuration.WithLabelValues("local", "get").Observe(0.001)
	m.StoreRead.WithLabelValues("local").Add(1)
	m.StoreWritten.WithLabelValues("local").Add(1)
	m.CommitDuration.WithLabelValues("ok").Observe(0.01)
	m.Wakes.WithLabelValues("ok").Inc()
	m.EtcdRequests.WithLabelValues("/etcdserverpb.KV/Range", "ok").Inc()
	m.EtcdDuration.WithLabelValues("/etcdserverpb.KV/Range").Observe(0.001)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var ours []*dto.MetricFamily
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "cairn_") {
			ours = append(ours, f)
			n++
		}
	}
	if want := len(m.Descs()); n != want {
		t.Fatalf("%d cairn_ families gathered, %d registered", n, want)
	}
	problems, err := promlint.NewWithMetricFamilies(ours).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	// And the whole exposition, as served, parses.
	var b strings.Builder
	for _, f := range fams {
		if _, err := expfmt.MetricFamilyToText(&b, f); err != nil {
			t.Fatal(err)
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := p.TextToMetricFamilies(strings.NewReader(b.String())); err != nil {
		t.Fatal(err)
	}
}

// TestQueueGauges: the queue gauges sum the tracked queues at each scrape
// and forget an untracked one.
func TestQueueGauges(t *testing.T) {
	m := metrics.New()
	gauge := func(name string) float64 {
		fams, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("%s not gathered", name)
		return 0
	}
	n := 3
	a := m.TrackUploadQueue(func() int { return n })
	b := m.TrackUploadQueue(func() int { return 4 })
	c := m.TrackCommitQueue(func() int { return 2 })
	if g := gauge("cairn_upload_queue_length"); g != 7 {
		t.Fatalf("upload queue %v, want 7", g)
	}
	n = 1
	if g := gauge("cairn_upload_queue_length"); g != 5 {
		t.Fatalf("upload queue %v after a drain, want 5", g)
	}
	b()
	a()
	if g := gauge("cairn_upload_queue_length"); g != 0 {
		t.Fatalf("upload queue %v with nothing tracked", g)
	}
	if g := gauge("cairn_mount_commit_queue_length"); g != 2 {
		t.Fatalf("commit queue %v, want 2", g)
	}
	c()
}
