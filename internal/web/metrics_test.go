package web

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"cairn.dev/cairn/internal/httpauth"
	"cairn.dev/cairn/internal/metrics"
)

// TestMetricsBehindLogin: /metrics is served in Prometheus' text format
// to a user with an app password, and refused without one.
func TestMetricsBehindLogin(t *testing.T) {
	users := httpauth.OpenUsers(filepath.Join(t.TempDir(), "passwd.json"))
	pass, err := users.Add("prometheus", false)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	m.StoreWritten.WithLabelValues("local").Add(42)
	h, err := New(&fakeSource{}, Options{Users: users, Metrics: m.Handler()})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("GET", "/metrics", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("/metrics without a login: %d", rec.Code)
	}
	req = httptest.NewRequest("GET", "/metrics", nil)
	req.SetBasicAuth("prometheus", pass)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatal(err)
	}
	f := fams["cairn_store_written_bytes_total"]
	if f == nil || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter().GetValue() != 42 {
		t.Fatalf("cairn_store_written_bytes_total: %v", f)
	}
}
