// Package dash is rain's live dashboard and operator's console: a page
// served at /admin/ (static files embedded in the binary: no build step,
// nothing fetched from elsewhere), the redirect that leads a browser from
// / to it, and the timeline it draws, sampled once a second from the
// process's own metrics.
//
// The page asks for the admin token once and keeps it in the tab's
// sessionStorage; it sends it as a bearer token to the operator API and
// never puts it in a URL or a cookie. It polls GET /admin/stats (this
// package) and GET /admin/pools and GET /admin/pools/{id} (the operator
// API), and acts only through the operator API: POST /admin/pools, its
// end and close, the audit (docs/console.md).
package dash

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

//go:embed static
var static embed.FS

// Security headers of every file of the page. The page runs only its own
// scripts and styles and fetches only this origin (CSP default-src 'self':
// an injected <script> or a script from elsewhere does not run, and
// nothing is sent to another host); no other site may frame it, so no
// click on End or Close can be hijacked (frame-ancestors 'none'); a
// browser takes each file as the type it is served with (nosniff); and a
// link followed from it tells the next site nothing (no-referrer).
const (
	CSP            = "default-src 'self'; frame-ancestors 'none'"
	ReferrerPolicy = "no-referrer"
)

// Files serves the dashboard's page and scripts under prefix (the
// request's path less prefix names the file; "" is the page), with the
// security headers above; a request for anything else goes to notFound.
func Files(prefix string, notFound http.Handler) http.Handler {
	files := http.StripPrefix(prefix, http.FileServerFS(staticFiles()))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Has(prefix, r.URL.Path) {
			notFound.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", ReferrerPolicy)
		files.ServeHTTP(w, r)
	})
}

// Home answers GET / with a redirect to the dashboard at prefix: someone
// who opens rain's address in a browser lands on the operator's console,
// not on an error. The body is JSON, as every answer of rain's HTTP API
// is, and names where to go, for a client that does not follow redirects.
func Home(prefix string) http.Handler {
	body, _ := json.Marshal(map[string]string{"dashboard": prefix, "openapi": "/openapi.json"}) // strings: cannot fail
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Location", prefix)
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusFound)
		_, _ = w.Write(append(body, '\n'))
	})
}

func staticFiles() fs.FS {
	sub, _ := fs.Sub(static, "static") // static is embedded: it is there
	return sub
}

// Has reports whether Files(prefix, ...) serves a file at path.
func Has(prefix, path string) bool {
	name, ok := strings.CutPrefix(path, prefix)
	if name == "" {
		name = "index.html"
	}
	fi, err := fs.Stat(staticFiles(), name)
	return ok && err == nil && !fi.IsDir()
}

// Point is one second of the timeline.
type Point struct {
	At time.Time `json:"at"`
	// Grabs is the grabs answered in that second, by status.
	Grabs map[string]float64 `json:"grabs"`
	// Shed is the grabs shed (503 overloaded before any work) in it.
	Shed float64 `json:"shed"`
	// P50MS and P99MS are the grab latency percentiles of that second
	// (from the latency histogram's buckets); null when no grab was
	// answered.
	P50MS *float64 `json:"p50_ms"`
	P99MS *float64 `json:"p99_ms"`
	// The worker pool, the reaper and the serials at that second.
	PoolCapacity float64 `json:"pool_capacity"`
	PoolRunning  float64 `json:"pool_running"`
	ReaperLeader bool    `json:"reaper_leader"`
	ReaperLagS   float64 `json:"reaper_lag_seconds"`
	// BreakersOpen is the shards whose breaker is open (or half-open).
	BreakersOpen []string `json:"breakers_open"`
}

// Timeline samples a metrics registry once a second and keeps the last
// Keep points.
type Timeline struct {
	g    prometheus.Gatherer
	keep int

	mu     sync.Mutex // guards the fields below
	points []Point
	last   *sample // the previous sample, for rates
}

// Keep is the points a timeline keeps: five minutes.
const Keep = 300

// NewTimeline returns a timeline over g; Run samples it.
func NewTimeline(g prometheus.Gatherer) *Timeline {
	return &Timeline{g: g, keep: Keep}
}

// Run samples every second until ctx ends.
func (t *Timeline) Run(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	t.Sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.Sample(now)
		}
	}
}

// Points returns the points after since (all when since is zero).
func (t *Timeline) Points(since time.Time) []Point {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []Point{}
	for _, p := range t.points {
		if p.At.After(since) {
			out = append(out, p)
		}
	}
	return out
}

// sample is the cumulative figures read at one instant.
type sample struct {
	at      time.Time
	grabs   map[string]float64
	shed    float64
	buckets []bucket // the grab latency histogram, all statuses summed
}

type bucket struct {
	le    float64
	count float64
}

// Sample reads the registry now and appends a point with the rates since
// the previous sample.
func (t *Timeline) Sample(now time.Time) {
	families, err := t.g.Gather()
	if err != nil && len(families) == 0 {
		return
	}
	s := &sample{at: now, grabs: map[string]float64{}}
	p := Point{At: now.Truncate(time.Millisecond), Grabs: map[string]float64{}, BreakersOpen: []string{}}
	for _, f := range families {
		switch f.GetName() {
		case "rain_grabs_total":
			for _, m := range f.GetMetric() {
				s.grabs[label(m, "status")] += m.GetCounter().GetValue()
			}
		case "rain_grab_overloaded_total":
			for _, m := range f.GetMetric() {
				if label(m, "reason") == "shed" {
					s.shed += m.GetCounter().GetValue()
				}
			}
		case "rain_grab_duration_seconds":
			s.buckets = sumBuckets(f.GetMetric())
		case "rain_pool_capacity":
			p.PoolCapacity = value(f)
		case "rain_pool_running":
			p.PoolRunning = value(f)
		case "rain_reaper_leader":
			p.ReaperLeader = value(f) == 1
		case "rain_reaper_lag_seconds":
			p.ReaperLagS = value(f)
		case "rain_shard_breaker_state":
			for _, m := range f.GetMetric() {
				if m.GetGauge().GetValue() != 0 {
					p.BreakersOpen = append(p.BreakersOpen, label(m, "shard"))
				}
			}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if prev := t.last; prev != nil {
		secs := now.Sub(prev.at).Seconds()
		if secs <= 0 {
			return
		}
		for st, v := range s.grabs {
			p.Grabs[st] = math.Max(0, v-prev.grabs[st]) / secs
		}
		p.Shed = math.Max(0, s.shed-prev.shed) / secs
		// A histogram absent from the previous sample had observed nothing.
		if n := len(prev.buckets); n == len(s.buckets) || n == 0 {
			delta := make([]bucket, len(s.buckets))
			for i, b := range s.buckets {
				delta[i] = b
				if n > 0 {
					delta[i].count -= prev.buckets[i].count
				}
			}
			p.P50MS, p.P99MS = quantileMS(delta, 0.5), quantileMS(delta, 0.99)
		}
		t.points = append(t.points, p)
		if len(t.points) > t.keep {
			t.points = append(t.points[:0], t.points[len(t.points)-t.keep:]...)
		}
	}
	t.last = s
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value is an unlabeled family's value.
func value(f *dto.MetricFamily) float64 {
	ms := f.GetMetric()
	if len(ms) == 0 {
		return 0
	}
	if g := ms[0].GetGauge(); g != nil {
		return g.GetValue()
	}
	return ms[0].GetCounter().GetValue()
}

// sumBuckets adds the classic buckets of every series of a histogram (they
// share their bounds), +Inf last.
func sumBuckets(ms []*dto.Metric) []bucket {
	var out []bucket
	for _, m := range ms {
		h := m.GetHistogram()
		bs := h.GetBucket()
		if out == nil {
			out = make([]bucket, len(bs)+1)
			for i, b := range bs {
				out[i].le = b.GetUpperBound()
			}
			out[len(bs)].le = math.Inf(1)
		}
		if len(bs)+1 != len(out) {
			continue
		}
		for i, b := range bs {
			out[i].count += float64(b.GetCumulativeCount())
		}
		out[len(bs)].count += float64(h.GetSampleCount())
	}
	return out
}

// quantileMS estimates the q-quantile, in ms, of cumulative buckets by
// linear interpolation within the bucket it falls in (as Prometheus's
// histogram_quantile does); nil when the buckets count nothing.
func quantileMS(bs []bucket, q float64) *float64 {
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return nil
	}
	rank := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			upper := b.le
			if math.IsInf(upper, 1) {
				upper = lower // beyond the last bound: say the last bound
			}
			v := upper
			if n := b.count - below; n > 0 {
				v = lower + (upper-lower)*(rank-below)/n
			}
			ms := math.Round(v*1e6) / 1e3
			return &ms
		}
		lower, below = b.le, b.count
	}
	return nil
}
