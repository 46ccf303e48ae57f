package dash

import (
	"encoding/json"
	"io/fs"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTimeline: a second's point has the rates and percentiles of what the
// registry's counters and histogram gained in that second.
func TestTimeline(t *testing.T) {
	reg := prometheus.NewRegistry()
	grabs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rain_grabs_total"}, []string{"status"})
	lat := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rain_grab_duration_seconds",
		Buckets: []float64{.001, .002, .004, .008}}, []string{"status"})
	over := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rain_grab_overloaded_total"}, []string{"reason"})
	reg.MustRegister(grabs, lat, over)
	grabs.WithLabelValues("granted").Add(5) // before the first sample: not in any point
	tl := NewTimeline(reg)
	t0 := time.Unix(1_000_000, 0)
	tl.Sample(t0)
	if got := tl.Points(time.Time{}); len(got) != 0 {
		t.Fatalf("one sample made %d points, want 0 (a rate needs two)", len(got))
	}
	// In the next 2 s: 100 grants at 1.5 ms (bucket 1-2 ms), one sold_out
	// at 7 ms (bucket 4-8 ms), 10 shed.
	for range 100 {
		grabs.WithLabelValues("granted").Inc()
		lat.WithLabelValues("granted").Observe(.0015)
	}
	grabs.WithLabelValues("sold_out").Inc()
	lat.WithLabelValues("sold_out").Observe(.007)
	over.WithLabelValues("shed").Add(10)
	over.WithLabelValues("busy").Add(3)
	tl.Sample(t0.Add(2 * time.Second))
	pts := tl.Points(time.Time{})
	if len(pts) != 1 {
		t.Fatalf("%d points, want 1", len(pts))
	}
	p := pts[0]
	if p.Grabs["granted"] != 50 || p.Grabs["sold_out"] != 0.5 || p.Shed != 5 {
		t.Fatalf("point %+v, want 50 granted/s, 0.5 sold_out/s, 5 shed/s", p)
	}
	// Rank 50.5 of 101 falls in 1-2 ms at (50.5/100): 1.505 ms; rank 99.99
	// still in it: 1.9999 ms -> 2.0 ms rounded to µs.
	if p.P50MS == nil || math.Abs(*p.P50MS-1.505) > 0.001 || p.P99MS == nil || math.Abs(*p.P99MS-2.0) > 0.001 {
		t.Fatalf("p50 %v p99 %v, want 1.505 and 2.0 ms", deref(p.P50MS), deref(p.P99MS))
	}
	if got := tl.Points(p.At); len(got) != 0 {
		t.Fatalf("points after the last = %d, want 0", len(got))
	}

	// A quiet second: no latency, zero rates.
	tl.Sample(t0.Add(3 * time.Second))
	q := tl.Points(p.At)
	if len(q) != 1 || q[0].P50MS != nil || q[0].Grabs["granted"] != 0 {
		t.Fatalf("quiet second %+v, want no percentiles and no grabs", q)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func TestTimelineKeepsFiveMinutes(t *testing.T) {
	tl := NewTimeline(prometheus.NewRegistry())
	t0 := time.Unix(1_000_000, 0)
	for i := range Keep + 50 {
		tl.Sample(t0.Add(time.Duration(i) * time.Second))
	}
	pts := tl.Points(time.Time{})
	if len(pts) != Keep || !pts[len(pts)-1].At.Equal(t0.Add(time.Duration(Keep+49)*time.Second)) {
		t.Fatalf("%d points ending %v, want the last %d", len(pts), pts[len(pts)-1].At, Keep)
	}
}

// TestFilesSecurityHeaders: every file of the page carries the security
// headers (its own scripts only, no framing, no sniffing, no referrer);
// a path that is no file of it goes to the not-found handler as it came.
func TestFilesSecurityHeaders(t *testing.T) {
	notFound := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"status":"not_found"}`))
	})
	h := Files("/admin/", notFound)
	want := map[string]string{
		"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
	}
	files, err := fs.Glob(staticFiles(), "*")
	if err != nil || len(files) < 3 {
		t.Fatalf("static files %v, %v: want the page, its scripts and its style", files, err)
	}
	// index.html is the page at /admin/ (the file server redirects its name there).
	for _, path := range append([]string{"/admin/"}, prefixed("/admin/", slices.DeleteFunc(files, func(n string) bool { return n == "index.html" }))...) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s = %d, want 200", path, rec.Code)
		}
		for k, v := range want {
			if got := rec.Header().Get(k); got != v {
				t.Errorf("GET %s: %s = %q, want %q", path, k, got, v)
			}
		}
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/admin/nope.js", nil))
	if rec.Code != http.StatusNotFound || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /admin/nope.js = %d %q, want the not-found handler's JSON 404", rec.Code, rec.Header().Get("Content-Type"))
	}
}

// TestPageLoadsOnlyItsOwnFiles: the page names no script, style, font or
// image of another origin, nor any inline script or style the CSP would
// block: it works offline and under default-src 'self'.
func TestPageLoadsOnlyItsOwnFiles(t *testing.T) {
	page, err := fs.ReadFile(staticFiles(), "index.html")
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	for _, m := range regexp.MustCompile(`(?i)\s(src|href)="([^"]*)"`).FindAllStringSubmatch(html, -1) {
		if regexp.MustCompile(`(?i)^([a-z]+:|//)`).MatchString(m[2]) {
			t.Errorf("index.html loads %q: the page must load only its own files", m[2])
		}
	}
	for _, inline := range []string{`(?i)<style`, `(?i)\sstyle=`, `(?i)\son[a-z]+=`, `(?i)<script>`, `(?i)<script\s[^>]*>[^<]`} {
		if m := regexp.MustCompile(inline).FindString(html); m != "" {
			t.Errorf("index.html has inline code (%q): the CSP blocks it", m)
		}
	}
	css, _ := fs.Glob(staticFiles(), "*.css")
	js, _ := fs.Glob(staticFiles(), "*.js")
	for _, name := range append(css, js...) {
		b, _ := fs.ReadFile(staticFiles(), name)
		if regexp.MustCompile(`@import|url\(\s*['"]?(https?:)?//|fetch\(\s*['"]https?:`).Match(b) {
			t.Errorf("%s loads something from elsewhere", name)
		}
	}
}

// TestHome: GET / redirects to the dashboard, with a JSON body naming it.
func TestHome(t *testing.T) {
	rec := httptest.NewRecorder()
	Home("/admin/").ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	var body map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusFound ||
		rec.Header().Get("Location") != "/admin/" || rec.Header().Get("Content-Type") != "application/json" || body["dashboard"] != "/admin/" {
		t.Fatalf("GET / = %d, Location %q, %q %s (%v); want 302 to /admin/ with a JSON body naming it",
			rec.Code, rec.Header().Get("Location"), rec.Header().Get("Content-Type"), rec.Body, err)
	}
}

func prefixed(prefix string, names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = prefix + n
	}
	return out
}
