package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"rain/loadtest/rainload/internal/timeline"
)

// grace is how long after a second ends the monitor reads its counters, so that
// requests finishing right at the boundary have recorded theirs.
const grace = 100 * time.Millisecond

// monitor turns the driver's per-second counters into timeline samples, writes
// them as JSON lines, and prints a progress line every progressEvery samples (0:
// none). It owns the per-second slots it reads: it empties each once read.
type monitor struct {
	d             *driver
	admin         *admin // nil when not scraping
	out           *bufio.Writer
	enc           *json.Encoder
	werr          error // first error writing the timeline
	stderr        io.Writer
	progressEvery int
	window        []timeline.Sample // samples since the last progress line
}

func newMonitor(d *driver, a *admin, tl io.Writer, stderr io.Writer) *monitor {
	m := &monitor{d: d, admin: a, stderr: stderr}
	if tl != nil {
		m.out = bufio.NewWriter(tl)
		m.enc = json.NewEncoder(m.out)
	}
	if p := d.cfg.progress; p > 0 {
		m.progressEvery = int((p + time.Second - 1) / time.Second)
	}
	return m
}

// run emits a sample grace after the end of each second until end delivers the
// run's end (as time since start); it then emits the seconds up to that end at
// once and returns the first timeline write error.
func (m *monitor) run(end <-chan time.Duration) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for s := 0; ; s++ {
		timer.Reset(time.Until(m.d.start.Add(time.Duration(s+1)*time.Second + grace)))
		select {
		case <-timer.C:
			m.emit(s)
		case e := <-end:
			for last := int((e - 1) / time.Second); s <= last; s++ {
				m.emit(s)
			}
			if m.out != nil && m.werr == nil {
				m.werr = m.out.Flush()
			}
			return m.werr
		}
	}
}

// emit reads and empties second s's counters into a sample.
func (m *monitor) emit(s int) {
	sec := &m.d.secs[slot(time.Duration(s)*time.Second)]
	smp := timeline.Sample{
		T:        s,
		Offered:  sec.offered.Swap(0),
		Dropped:  sec.dropped.Swap(0),
		Inflight: m.d.inflight.Load(),
		Statuses: map[string]int64{},
		P50Ms:    ms(sec.accepted.Quantile(0.5)),
		P99Ms:    ms(sec.accepted.Quantile(0.99)),
		P999Ms:   ms(sec.accepted.Quantile(0.999)),
	}
	sec.accepted.Reset()
	for st := range nStatus {
		n := sec.statuses[st].Swap(0)
		if n == 0 {
			continue
		}
		smp.Statuses[statusNames[st]] = n
		if st != transport {
			smp.Answered += n
		}
		if st.goodput() {
			smp.Goodput += n
		}
		if st == overloaded {
			smp.Shed += n
		}
	}
	if m.admin != nil {
		smp.Gauges, smp.RemainingCount, smp.RemainingCents = m.admin.latest()
	}
	if m.enc != nil && m.werr == nil {
		if m.werr = m.enc.Encode(smp); m.werr == nil {
			m.werr = m.out.Flush()
		}
	}
	if m.progressEvery > 0 {
		m.window = append(m.window, smp)
		if len(m.window) >= m.progressEvery {
			m.progress()
			m.window = m.window[:0]
		}
	}
}

// progress prints one line: the window's rates and worst per-second p99, the
// run's totals so far.
func (m *monitor) progress() {
	var offered, answered, goodput, shed int64
	var p99 float64
	for _, s := range m.window {
		offered += s.Offered
		answered += s.Answered
		goodput += s.Goodput
		shed += s.Shed
		p99 = max(p99, s.P99Ms)
	}
	n := float64(len(m.window))
	last := m.window[len(m.window)-1]
	var counts strings.Builder
	for st := range nStatus {
		if c := m.d.count(st); c > 0 {
			fmt.Fprintf(&counts, " %s=%d", statusNames[st], c)
		}
	}
	fmt.Fprintf(m.stderr, "rainload %3ds: offered %.0f/s answered %.0f/s goodput %.0f/s shed %.0f/s inflight %d dropped %d p99 %.2fms |%s\n",
		last.T+1, float64(offered)/n, float64(answered)/n, float64(goodput)/n, float64(shed)/n,
		last.Inflight, m.d.dropped.Load(), p99, counts.String())
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
