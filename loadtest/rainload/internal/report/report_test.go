package report

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain/loadtest/rainload/internal/timeline"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// spike is a small rain: the rate ramps up, holds, sheds, and ramps down while
// the stock runs out.
func spike(withGauges bool) []timeline.Sample {
	rates := []int64{100, 2000, 8000, 8000, 8000, 3000, 0}
	var ss []timeline.Sample
	rem := int64(20000)
	for i, r := range rates {
		shed := max(r-5000, 0)
		good := r - shed
		rem = max(rem-good, 0)
		s := timeline.Sample{
			T: i, Offered: r, Answered: r, Goodput: good, Shed: shed,
			Statuses: map[string]int64{"granted": good, "overloaded": shed},
			P50Ms:    1.5 + float64(i), P99Ms: 8 * float64(i+1), P999Ms: 20 * float64(i+1),
		}
		if r == 0 {
			s.P50Ms, s.P99Ms, s.P999Ms = 0, 0, 0 // nothing accepted: a gap
		}
		if withGauges {
			rc := rem
			s.RemainingCount, s.Gauges = &rc, map[string]float64{"rain_pool_capacity": float64(64 * (i + 1)), "rain_pool_running": float64(10 * i)}
		}
		ss = append(ss, s)
	}
	return ss
}

// wellFormed checks page with a strict XML decoder and counts its elements by name.
func wellFormed(t *testing.T, page []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(page))
	d.Strict = true
	counts := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return counts
		}
		if err != nil {
			t.Fatalf("report is not well-formed: %v\n%s", err, page)
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
}

func TestWrite(t *testing.T) {
	var b bytes.Buffer
	err := Write(&b, Page{
		Title:     "rain & baseline <grab>",
		Notes:     "grab: rain 30000 grabs/s\n  p99 <5 ms & more",
		Generated: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC),
		Runs: []Run{
			{Name: "rain spike", Samples: spike(true)},
			{Name: "baseline", Samples: spike(false)},
			{Name: "empty", Samples: nil},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	page := b.Bytes()
	counts := wellFormed(t, page)
	// 5 charts for the run with gauges and stock, 3 for the one without.
	if counts["svg"] != 8 {
		t.Errorf("%d <svg> charts, want 8", counts["svg"])
	}
	if counts["h2"] != 3 {
		t.Errorf("%d run headings, want 3", counts["h2"])
	}
	if counts["polyline"] < 8 {
		t.Errorf("%d polylines, want at least one per chart", counts["polyline"])
	}
	for _, want := range []string{
		"rain &amp; baseline &lt;grab&gt;", "p99 &lt;5 ms &amp; more", "Latency of accepted requests",
		"Throughput", "Shed, dropped and failed", "Worker pool", "Remaining stock",
		"No rain_pool_* gauges were scraped", "No samples.", "2026-11-30T00:00:00Z",
	} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("report lacks %q", want)
		}
	}
	// Offline: nothing is fetched.
	for _, bad := range []string{"<script", "http://cdn", "https://", "<link", "@import", "src="} {
		if bytes.Contains(page, []byte(bad)) {
			t.Errorf("report contains %q: it must load nothing", bad)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{
		{0, 1}, {0.7, 1}, {1, 1}, {1.2, 2}, {3, 5}, {7, 10}, {2500, 5000}, {0.013, 0.02},
	} {
		if got := niceStep(tt.in); got != tt.want {
			t.Errorf("niceStep(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestChartScales(t *testing.T) {
	var b strings.Builder
	chart{title: "log", xs: []float64{0.5, 1.5}, logY: true, series: []series{{"a", blue, []float64{0.3, 42}}}}.write(&b)
	// Decades from 0.1 to 100 ms.
	for _, tick := range []string{">0.1<", ">1<", ">10<", ">100<"} {
		if !strings.Contains(b.String(), tick) {
			t.Errorf("log chart lacks tick %s:\n%s", tick, b.String())
		}
	}
	b.Reset()
	chart{title: "lin", xs: []float64{0.5}, series: []series{{"a", blue, []float64{0}}}}.write(&b)
	if !strings.Contains(b.String(), "<circle") {
		t.Errorf("a lone point is not drawn:\n%s", b.String())
	}
}
