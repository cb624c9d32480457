// Package metrics holds cairn's Prometheus metrics: one registry per
// process (Default), the metrics every layer counts into, a store wrapper
// that counts requests, latency and bytes per store and operation, and the
// /metrics handler that cairn web, the node service, the mount and a put
// serve. doc/metrics.md lists every metric; a test keeps the two equal.
//
// Labels come only from small bounded sets (a store's name, an operation,
// a result): never a file, a path or an object ID.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
)

// Metrics is one registry and the metrics registered in it.
type Metrics struct {
	Registry *prometheus.Registry

	StoreRequests *prometheus.CounterVec   // store, op, result
	StoreDuration *prometheus.HistogramVec // store, op
	StoreRead     *prometheus.CounterVec   // store: bytes returned by Get
	StoreWritten  *prometheus.CounterVec   // store: bytes given to Put

	CacheHits   prometheus.Counter
	CacheMisses prometheus.Counter

	uploadQueue, commitQueue queues // summed at each scrape

	own []prometheus.Collector // the cairn_ metrics, for Descs

	CommitDuration *prometheus.HistogramVec // result: metadata commit of a version

	Wakes        *prometheus.CounterVec // result
	WakeDuration prometheus.Histogram

	OffloadBytes prometheus.Counter
	ReclaimBytes prometheus.Counter

	EtcdRequests *prometheus.CounterVec   // method, result
	EtcdDuration *prometheus.HistogramVec // method
}

// latency buckets, seconds: from a cached local read to a slow cloud PUT.
var latency = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// New makes a fresh registry with every cairn metric and the Go runtime's
// and the process's collectors.
func New() *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.StoreRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cairn_store_requests_total",
		Help: "Store requests by store, operation (put, get, has, check, delete, list) and result (ok, not_found, error).",
	}, []string{"store", "op", "result"})
	m.StoreDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cairn_store_request_duration_seconds",
		Help:    "Latency of store requests by store and operation.",
		Buckets: latency,
	}, []string{"store", "op"})
	m.StoreRead = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cairn_store_read_bytes_total",
		Help: "Bytes read from a store (returned by successful Gets).",
	}, []string{"store"})
	m.StoreWritten = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cairn_store_written_bytes_total",
		Help: "Bytes written to a store (given to successful Puts).",
	}, []string{"store"})
	m.CacheHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cairn_chunk_cache_hits_total",
		Help: "Reads served by the chunk cache of remote and cloud stores.",
	})
	m.CacheMisses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cairn_chunk_cache_misses_total",
		Help: "Reads the chunk cache had to fetch from the backing store.",
	})
	uploadQueue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cairn_upload_queue_length",
		Help: "Records pending in the upload queues (put --background) this process has open.",
	}, m.uploadQueue.sum)
	commitQueue := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cairn_mount_commit_queue_length",
		Help: "Records pending in the mount's commit queue (files written and not yet committed).",
	}, m.commitQueue.sum)
	m.CommitDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cairn_commit_duration_seconds",
		Help:    "Latency of the metadata commit of a new version, by result (ok, error).",
		Buckets: latency,
	}, []string{"result"})
	m.Wakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cairn_wakes_total",
		Help: "Sleeping nodes woken for a read, by result (ok, error).",
	}, []string{"result"})
	m.WakeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "cairn_wake_duration_seconds",
		Help:    "Time from waking a sleeping node until it serves.",
		Buckets: []float64{.5, 1, 2, 5, 10, 20, 30, 60, 120, 300},
	})
	m.OffloadBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cairn_offload_bytes_total",
		Help: "Bytes of versions committed offloaded: written to an awake store in place of a home that was not awake.",
	})
	m.ReclaimBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "cairn_reclaim_bytes_total",
		Help: "Bytes reclaim copied home to stores whose node woke.",
	})
	m.EtcdRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cairn_etcd_requests_total",
		Help: "Round trips to etcd (or the metadata gateway) by gRPC method and result (ok, error).",
	}, []string{"method", "result"})
	m.EtcdDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cairn_etcd_request_duration_seconds",
		Help:    "Latency of etcd round trips by gRPC method.",
		Buckets: latency,
	}, []string{"method"})
	m.own = []prometheus.Collector{
		m.StoreRequests, m.StoreDuration, m.StoreRead, m.StoreWritten,
		m.CacheHits, m.CacheMisses, uploadQueue, commitQueue,
		m.CommitDuration, m.Wakes, m.WakeDuration, m.OffloadBytes, m.ReclaimBytes,
		m.EtcdRequests, m.EtcdDuration,
	}
	m.Registry.MustRegister(m.own...)
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

var (
	defOnce sync.Once
	def     *Metrics
)

// Default is the process's registry, made on first use. Every layer counts
// into it; the process serves it where it was asked to.
func Default() *Metrics {
	defOnce.Do(func() { def = New() })
	return def
}

// Result is the result label of an error: ok, not_found or error.
func Result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case isNotFound(err):
		return "not_found"
	default:
		return "error"
	}
}

// ObserveCommit records one metadata commit of a version that began at t0.
func (m *Metrics) ObserveCommit(t0 time.Time, err error) {
	r := "ok"
	if err != nil {
		r = "error"
	}
	m.CommitDuration.WithLabelValues(r).Observe(time.Since(t0).Seconds())
}

// ObserveWake records one wake of a sleeping node that began at t0.
func (m *Metrics) ObserveWake(t0 time.Time, err error) {
	r := "ok"
	if err != nil {
		r = "error"
	}
	m.Wakes.WithLabelValues(r).Inc()
	if err == nil {
		m.WakeDuration.Observe(time.Since(t0).Seconds())
	}
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Serve listens on addr (host:port; port 0 picks one) and serves /metrics
// there until ctx ends. It returns the address it listens on once it does.
// Only a loopback address is accepted (this listener has no TLS and no
// login; cairn web serves /metrics to the network behind its login).
func (m *Metrics) Serve(ctx context.Context, addr string) (string, error) {
	if err := checkLoopback(addr); err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", cairn.E("serve metrics", cairn.Unavailable, addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln) //nolint:errcheck // ends with ErrServerClosed when ctx ends
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	return ln.Addr().String(), nil
}

func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return cairn.E("serve metrics", cairn.Invalid, addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return cairn.E("serve metrics", cairn.Invalid, addr, errors.New("not a loopback address: metrics are served on loopback only"))
	}
	return nil
}

func isNotFound(err error) bool { return errors.Is(err, cairn.ErrNotFound) }

// EtcdInterceptor is a gRPC client interceptor that counts every unary
// round trip to etcd (or the metadata gateway) and its latency, by gRPC
// method (a small fixed set: /etcdserverpb.KV/Range, .../Txn, ...). Put it
// after any retrying interceptor, so that each try counts.
func (m *Metrics) EtcdInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		t0 := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		r := "ok"
		if err != nil {
			r = "error"
		}
		m.EtcdRequests.WithLabelValues(method, r).Inc()
		m.EtcdDuration.WithLabelValues(method).Observe(time.Since(t0).Seconds())
		return err
	}
}

// queues sums the lengths of the open queues of one kind at each scrape.
type queues struct {
	mu   sync.Mutex
	next int
	lens map[int]func() int
}

func (q *queues) track(length func() int) (untrack func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.lens == nil {
		q.lens = map[int]func() int{}
	}
	k := q.next
	q.next++
	q.lens[k] = length
	return func() {
		q.mu.Lock()
		delete(q.lens, k)
		q.mu.Unlock()
	}
}

func (q *queues) sum() float64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, l := range q.lens {
		n += l()
	}
	return float64(n)
}

// TrackUploadQueue counts length() (a journal's Len) in
// cairn_upload_queue_length until untrack is called. length is called at
// each scrape and must be safe from any goroutine.
func (m *Metrics) TrackUploadQueue(length func() int) (untrack func()) {
	return m.uploadQueue.track(length)
}

// TrackCommitQueue counts length() in cairn_mount_commit_queue_length
// until untrack is called, as TrackUploadQueue does.
func (m *Metrics) TrackCommitQueue(length func() int) (untrack func()) {
	return m.commitQueue.track(length)
}

// Descs returns the descriptions of the cairn_ metrics (not the Go
// runtime's and the process's): doc/metrics.md is checked against them.
func (m *Metrics) Descs() []*prometheus.Desc {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range m.own {
			c.Describe(ch)
		}
		close(ch)
	}()
	var ds []*prometheus.Desc
	for d := range ch {
		ds = append(ds, d)
	}
	return ds
}
