// Package metrics is rain's Prometheus registry: every series rain exports
// is defined in this package (names, help, labels, buckets), on one
// registry per process that GET /metrics serves.
//
// Two kinds of series: those observed on the hot path (a grab's answer and
// latency, a shard batch's size and round trip) are client_golang
// counters and histograms, resolved per label value once so that an
// observation costs no lookup; the rest are read from the components'
// Stats snapshots at scrape time (func collectors), so the components
// themselves know nothing of Prometheus.
package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry is one process's metrics.
type Registry struct {
	reg *prometheus.Registry // what Gatherer gives: cheap to read every second
	// scraped holds what only a scrape reads: the Go runtime and process
	// collectors, and the stock (read from the shards).
	scraped *prometheus.Registry
}

// Build describes the running binary for rain_build_info.
type Build struct {
	Version  string // rain's version ("devel" when unknown)
	Revision string // VCS revision, "" when unknown
}

// New returns a registry with the Go runtime and process collectors and
// rain_build_info.
func New(b Build) *Registry {
	r := &Registry{reg: prometheus.NewRegistry(), scraped: prometheus.NewRegistry()}
	r.scraped.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "rain_build_info",
		Help:        "Always 1; the labels say which rain runs.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision},
	})
	info.Set(1)
	r.reg.MustRegister(info)
	return r
}

// Handler serves the registry in the Prometheus exposition formats (text,
// or protobuf for a scraper that asks, which carries native histograms).
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{r.reg, r.scraped}, promhttp.HandlerOpts{Registry: r.reg})
}

// Gatherer is rain's own series but the stock, for readers in the process
// (the dashboard's timeline, every second).
func (r *Registry) Gatherer() prometheus.Gatherer { return r.reg }

// latencyBuckets are the classic buckets of the latency histograms, in
// seconds: a grab is answered in about a millisecond, a shed one in less,
// a shard that stalls up to its call budget (500 ms by default).
var latencyBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}

// histogram returns histogram options with native buckets (factor 1.1:
// about 10% resolution) beside the classic ones.
func histogram(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Name: name, Help: help, Buckets: buckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  160,
		NativeHistogramMinResetDuration: time.Hour,
	}
}

// Grabs records each answered grab. Its methods are safe for concurrent use
// and do not allocate.
type Grabs struct {
	latency    []prometheus.Observer
	count      []prometheus.Counter
	overloaded []prometheus.Counter
}

// Grabs registers the grab series: the answers by status (statuses are
// indexed as the caller counts them) with their latency, and the 503
// overloaded answers by reason.
func (r *Registry) Grabs(statuses, reasons []string) *Grabs {
	lat := prometheus.NewHistogramVec(histogram("rain_grab_duration_seconds",
		"Time from a grab's arrival to its answer, by status.", latencyBuckets), []string{"status"})
	cnt := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rain_grabs_total",
		Help: "Grab requests answered, by status."}, []string{"status"})
	over := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rain_grab_overloaded_total",
		Help: "Grabs answered 503 overloaded, by reason."}, []string{"reason"})
	r.reg.MustRegister(lat, cnt, over)
	g := &Grabs{}
	for _, st := range statuses {
		g.latency = append(g.latency, lat.WithLabelValues(st))
		g.count = append(g.count, cnt.WithLabelValues(st))
	}
	for _, rs := range reasons {
		g.overloaded = append(g.overloaded, over.WithLabelValues(rs))
	}
	return g
}

// Answered records a grab answered with statuses[status] after d.
func (g *Grabs) Answered(status int, d time.Duration) {
	g.count[status].Inc()
	g.latency[status].Observe(d.Seconds())
}

// Overloaded records a 503 overloaded answer for reasons[reason].
func (g *Grabs) Overloaded(reason int) { g.overloaded[reason].Inc() }

// batchSizeBuckets: claims per pipelined round trip.
var batchSizeBuckets = prometheus.ExponentialBuckets(1, 2, 11) // 1 .. 1024

// Batches registers the per-shard batch series and returns the observer
// that grab.Config.OnBatch takes.
func (r *Registry) Batches(shards []string) func(shard string, claims int, took time.Duration, failed bool) {
	lat := prometheus.NewHistogramVec(histogram("rain_shard_batch_duration_seconds",
		"Round trip of one pipelined batch of claims to a shard, by shard.", latencyBuckets), []string{"shard"})
	size := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rain_shard_batch_claims",
		Help: "Claims in one batch to a shard, by shard.", Buckets: batchSizeBuckets}, []string{"shard"})
	r.reg.MustRegister(lat, size)
	type obs struct{ lat, size prometheus.Observer }
	by := make(map[string]obs, len(shards)) // read-only from here
	for _, s := range shards {
		by[s] = obs{lat.WithLabelValues(s), size.WithLabelValues(s)}
	}
	return func(shard string, claims int, took time.Duration, _ bool) {
		if o, ok := by[shard]; ok {
			o.lat.Observe(took.Seconds())
			o.size.Observe(float64(claims))
		}
	}
}

// Sample is one value of a func series, with its label values.
type Sample struct {
	Labels []string
	V      float64
}

// funcCollector reads a family of samples at scrape time.
type funcCollector struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	read func() []Sample
}

func (c *funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *funcCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, c.typ, s.V, s.Labels...)
	}
}

func (r *Registry) funcs(typ prometheus.ValueType, name, help string, labels []string, read func() []Sample) {
	r.reg.MustRegister(&funcCollector{desc: prometheus.NewDesc(name, help, labels, nil), typ: typ, read: read})
}

// Counter registers an unlabeled counter read from f at scrape time.
func (r *Registry) Counter(name, help string, f func() float64) {
	r.funcs(prometheus.CounterValue, name, help, nil, func() []Sample { return []Sample{{V: f()}} })
}

// Gauge registers an unlabeled gauge read from f at scrape time.
func (r *Registry) Gauge(name, help string, f func() float64) {
	r.funcs(prometheus.GaugeValue, name, help, nil, func() []Sample { return []Sample{{V: f()}} })
}

// CounterVec registers a labeled counter family read from f at scrape time.
func (r *Registry) CounterVec(name, help string, labels []string, f func() []Sample) {
	r.funcs(prometheus.CounterValue, name, help, labels, f)
}

// GaugeVec registers a labeled gauge family read from f at scrape time.
func (r *Registry) GaugeVec(name, help string, labels []string, f func() []Sample) {
	r.funcs(prometheus.GaugeValue, name, help, labels, f)
}
