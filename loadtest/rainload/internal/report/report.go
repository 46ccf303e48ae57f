// Package report renders rainload timelines as one self-contained HTML page: for
// each run, line charts over time of latency percentiles, throughput, shed and
// dropped requests, the worker pool's gauges and the remaining stock, drawn as
// inline SVG. The page loads nothing (no scripts, no fonts, no CDN), so it reads
// the same offline, and it is well-formed XML, which its test checks.
package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"rain/loadtest/rainload/internal/timeline"
)

// Run is one load test: a name for the page and its timeline.
type Run struct {
	Name    string
	Samples []timeline.Sample
}

// Page is a report.
type Page struct {
	Title string
	// Notes is shown preformatted under the title (bench.sh puts its figures
	// there); empty for none.
	Notes string
	// Generated is the time shown as the page's date.
	Generated time.Time
	Runs      []Run
}

// Colors of the series, by role, chosen to stay apart for common color blindness.
const (
	blue   = "#1f77b4"
	orange = "#ff7f0e"
	green  = "#2ca02c"
	red    = "#d62728"
	purple = "#9467bd"
	grey   = "#7f7f7f"
)

// Write renders p to w.
func Write(w io.Writer, p Page) error {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>")
	b.WriteString(esc(p.Title))
	b.WriteString("</title>\n<style>\n" + css + "</style>\n</head>\n<body>\n<h1>")
	b.WriteString(esc(p.Title))
	b.WriteString("</h1>\n")
	fmt.Fprintf(&b, "<p class=\"meta\">Generated %s by rainload report. Each point is one second of a run: requests are counted in the second they were due (offered, dropped) or answered (the rest); latency runs from when a request was due.</p>\n",
		esc(p.Generated.UTC().Format(time.RFC3339)))
	if p.Notes != "" {
		b.WriteString("<pre class=\"notes\">" + esc(p.Notes) + "</pre>\n")
	}
	if len(p.Runs) > 1 {
		b.WriteString("<ul class=\"toc\">\n")
		for i, r := range p.Runs {
			fmt.Fprintf(&b, "<li><a href=\"#run%d\">%s</a></li>\n", i, esc(r.Name))
		}
		b.WriteString("</ul>\n")
	}
	for i, r := range p.Runs {
		writeRun(&b, i, r)
	}
	b.WriteString("</body>\n</html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

const css = `body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1000px; }
h1 { font-size: 22px; }
h2 { font-size: 18px; margin-top: 36px; border-top: 1px solid #ccc; padding-top: 12px; }
.meta { color: #555; }
pre.notes { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
table.stats { border-collapse: collapse; margin: 8px 0; }
table.stats td, table.stats th { padding: 2px 10px; text-align: right; border-bottom: 1px solid #eee; }
table.stats th { font-weight: 600; }
svg.chart { display: block; margin: 10px 0; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #333; }
svg.chart .title { font-size: 13px; font-weight: 600; }
svg.chart .grid { stroke: #e4e4e4; }
svg.chart .axis { stroke: #888; }
p.none { color: #777; font-style: italic; }
`

func writeRun(b *strings.Builder, i int, r Run) {
	fmt.Fprintf(b, "<h2 id=\"run%d\">%s</h2>\n", i, esc(r.Name))
	if len(r.Samples) == 0 {
		b.WriteString("<p class=\"none\">No samples.</p>\n")
		return
	}
	writeStats(b, r.Samples)
	n := len(r.Samples)
	xs := make([]float64, n)
	col := func(f func(s timeline.Sample) float64) []float64 {
		ys := make([]float64, n)
		for j, s := range r.Samples {
			ys[j] = f(s)
		}
		return ys
	}
	for j, s := range r.Samples {
		xs[j] = float64(s.T) + 0.5 // the middle of the second
	}
	// Seconds in which no accepted request finished have no latency.
	lat := func(f func(s timeline.Sample) float64) []float64 {
		return col(func(s timeline.Sample) float64 {
			if v := f(s); v > 0 {
				return v
			}
			return math.NaN()
		})
	}
	chart{
		title: "Latency of accepted requests (ms, log scale)", xs: xs, logY: true,
		series: []series{
			{"p50", blue, lat(func(s timeline.Sample) float64 { return s.P50Ms })},
			{"p99", orange, lat(func(s timeline.Sample) float64 { return s.P99Ms })},
			{"p99.9", red, lat(func(s timeline.Sample) float64 { return s.P999Ms })},
		},
	}.write(b)
	chart{
		title: "Throughput (requests/s)", xs: xs,
		series: []series{
			{"offered", grey, col(func(s timeline.Sample) float64 { return float64(s.Offered) })},
			{"answered", blue, col(func(s timeline.Sample) float64 { return float64(s.Answered) })},
			{"goodput", green, col(func(s timeline.Sample) float64 { return float64(s.Goodput) })},
		},
	}.write(b)
	chart{
		title: "Shed, dropped and failed (per second)", xs: xs,
		series: []series{
			{"shed (503 overloaded)", orange, col(func(s timeline.Sample) float64 { return float64(s.Shed) })},
			{"dropped by the driver", grey, col(func(s timeline.Sample) float64 { return float64(s.Dropped) })},
			{"errors (5xx, transport)", red, col(func(s timeline.Sample) float64 {
				return float64(s.Statuses["error"] + s.Statuses["transport"])
			})},
		},
	}.write(b)

	writeScraped(b, r.Samples, xs, col)
}

// writeScraped draws what the driver scraped from the target, when it did:
// the worker pool's gauges and the pool's remaining stock.
func writeScraped(b *strings.Builder, samples []timeline.Sample, xs []float64, col func(f func(s timeline.Sample) float64) []float64) {
	var pool []series
	for _, g := range []struct{ name, color string }{
		{"rain_pool_capacity", blue}, {"rain_pool_running", green},
		{"rain_pool_waiting", orange}, {"rain_pool_target", purple},
	} {
		if has(samples, func(s timeline.Sample) bool { _, ok := s.Gauges[g.name]; return ok }) {
			pool = append(pool, series{strings.TrimPrefix(g.name, "rain_pool_"), g.color,
				col(func(s timeline.Sample) float64 {
					if v, ok := s.Gauges[g.name]; ok {
						return v
					}
					return math.NaN()
				})})
		}
	}
	if len(pool) > 0 {
		chart{title: "Worker pool (rain_pool_* gauges)", xs: xs, series: pool}.write(b)
	} else {
		b.WriteString("<p class=\"none\">No rain_pool_* gauges were scraped in this run.</p>\n")
	}
	if has(samples, func(s timeline.Sample) bool { return s.RemainingCount != nil }) {
		chart{
			title: "Remaining stock (packets)", xs: xs,
			series: []series{{"remaining_count", purple, col(func(s timeline.Sample) float64 {
				if s.RemainingCount == nil {
					return math.NaN()
				}
				return float64(*s.RemainingCount)
			})}},
		}.write(b)
	} else {
		b.WriteString("<p class=\"none\">The pool's remaining stock was not scraped in this run.</p>\n")
	}
}

func has(ss []timeline.Sample, f func(timeline.Sample) bool) bool {
	for _, s := range ss {
		if f(s) {
			return true
		}
	}
	return false
}

// writeStats writes a table of the run's totals, from its samples.
func writeStats(b *strings.Builder, ss []timeline.Sample) {
	var offered, answered, goodput, shed, dropped, errs, peak int64
	var worst float64
	for _, s := range ss {
		offered += s.Offered
		answered += s.Answered
		goodput += s.Goodput
		shed += s.Shed
		dropped += s.Dropped
		errs += s.Statuses["error"] + s.Statuses["transport"]
		peak = max(peak, s.Goodput)
		worst = max(worst, s.P99Ms)
	}
	b.WriteString("<table class=\"stats\"><tr><th>seconds</th><th>offered</th><th>answered</th><th>goodput</th><th>peak goodput/s</th><th>shed</th><th>dropped</th><th>errors</th><th>worst 1-s p99</th></tr>\n")
	fmt.Fprintf(b, "<tr><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%d</td><td>%s ms</td></tr></table>\n",
		len(ss), offered, answered, goodput, peak, shed, dropped, errs, num(worst))
}

// series is one line of a chart; NaN values leave a gap.
type series struct {
	name  string
	color string
	ys    []float64
}

// chart is a line chart over time (seconds) with a linear or log y axis.
type chart struct {
	title  string
	xs     []float64
	series []series
	logY   bool
}

// Chart geometry, in SVG user units.
const (
	width, height            = 960, 250
	left, right, top, bottom = 70, 16, 34, 32
	plotW, plotH             = width - left - right, height - top - bottom
)

// yAxis is the chart's y range and ticks: powers of ten on a log scale,
// else from 0 in nice steps.
func (c chart) yAxis() (ymin, ymax float64, yticks []float64) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.series {
		for _, y := range s.ys {
			if math.IsNaN(y) || (c.logY && y <= 0) {
				continue
			}
			lo, hi = min(lo, y), max(hi, y)
		}
	}
	if c.logY {
		if math.IsInf(lo, 1) {
			lo, hi = 1, 1
		}
		ymin = math.Pow(10, math.Floor(math.Log10(lo)))
		ymax = math.Pow(10, math.Ceil(math.Log10(hi)))
		if ymax <= ymin {
			ymax = ymin * 10
		}
		for v := ymin; v <= ymax*1.0001; v *= 10 {
			yticks = append(yticks, v)
		}
		return ymin, ymax, yticks
	}
	if math.IsInf(hi, -1) || hi <= 0 {
		hi = 1
	}
	step := niceStep(hi / 4)
	ymax = math.Ceil(hi/step) * step
	for v := 0.0; v <= ymax*1.0001; v += step {
		yticks = append(yticks, v)
	}
	return 0, ymax, yticks
}

func (c chart) write(b *strings.Builder) {
	xmax := 1.0
	for _, x := range c.xs {
		xmax = max(xmax, math.Ceil(x))
	}
	ymin, ymax, yticks := c.yAxis()
	px := func(x float64) float64 { return left + x/xmax*plotW }
	py := func(y float64) float64 {
		f := (y - ymin) / (ymax - ymin)
		if c.logY {
			f = (math.Log10(y) - math.Log10(ymin)) / (math.Log10(ymax) - math.Log10(ymin))
		}
		return top + plotH - f*plotH
	}

	fmt.Fprintf(b, "<svg class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">\n",
		width, height, width, height, esc(c.title))
	fmt.Fprintf(b, "<text class=\"title\" x=\"%d\" y=\"18\">%s</text>\n", left, esc(c.title))
	// Legend, right-aligned in the title row.
	lx := float64(width - right)
	for i := len(c.series) - 1; i >= 0; i-- {
		s := c.series[i]
		lx -= float64(len(s.name))*6.5 + 34
		fmt.Fprintf(b, "<line x1=\"%s\" y1=\"14\" x2=\"%s\" y2=\"14\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%s\" y=\"18\">%s</text>\n",
			num(lx), num(lx+18), s.color, num(lx+22), esc(s.name))
	}
	for _, v := range yticks {
		y := py(v)
		fmt.Fprintf(b, "<line class=\"grid\" x1=\"%d\" y1=\"%s\" x2=\"%d\" y2=\"%s\"/><text x=\"%d\" y=\"%s\" text-anchor=\"end\">%s</text>\n",
			left, num(y), width-right, num(y), left-6, num(y+4), esc(num(v)))
	}
	xstep := niceStep(xmax / 10)
	for x := 0.0; x <= xmax+1e-9; x += xstep {
		fmt.Fprintf(b, "<line class=\"grid\" x1=\"%s\" y1=\"%d\" x2=\"%s\" y2=\"%d\"/><text x=\"%s\" y=\"%d\" text-anchor=\"middle\">%ss</text>\n",
			num(px(x)), top, num(px(x)), top+plotH, num(px(x)), height-bottom+16, num(x))
	}
	fmt.Fprintf(b, "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n",
		left, top, left, top+plotH, left, top+plotH, width-right, top+plotH)
	for _, s := range c.series {
		var pts []string
		flush := func() {
			switch len(pts) {
			case 0:
			case 1: // a lone point between gaps: a dot
				x, y, _ := strings.Cut(pts[0], ",")
				fmt.Fprintf(b, "<circle cx=\"%s\" cy=\"%s\" r=\"2\" fill=\"%s\"/>\n", x, y, s.color)
			default:
				fmt.Fprintf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" stroke-linejoin=\"round\" points=\"%s\"/>\n",
					s.color, strings.Join(pts, " "))
			}
			pts = pts[:0]
		}
		for i, y := range s.ys {
			if math.IsNaN(y) || (c.logY && y <= 0) {
				flush()
				continue
			}
			pts = append(pts, num(px(c.xs[i]))+","+num(py(y)))
		}
		flush()
	}
	b.WriteString("</svg>\n")
}

// niceStep returns 1, 2 or 5 times a power of ten, at least x.
func niceStep(x float64) float64 {
	if x <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// num formats a coordinate or a tick label: at most 3 decimals, no trailing zeros.
func num(v float64) string { return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64) }

// esc escapes text for both HTML and XML.
func esc(s string) string { return html.EscapeString(s) }
