// Package schedule computes when each request of an open-loop load test is due:
// the arrival times of a constant or piecewise-linear rate, in the manner of k6's
// ramping-arrival-rate executor.
//
// The rate r(t) starts at a start rate and ramps linearly to each stage's target
// over that stage's duration. Arrival n (n = 0, 1, 2, ...) is due at the instant
// the cumulative count ∫₀ᵗ r reaches n, so a constant rate R puts arrival n at n/R
// and a stage that ramps from a to b over d seconds holds (a+b)/2·d arrivals, give
// or take one. The times depend only on the schedule, never on how fast requests
// are answered: that is what makes the load open-loop.
package schedule

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Stage ramps the rate linearly from where the previous stage ended (or the start
// rate) to Target arrivals per second over Duration.
type Stage struct {
	Duration time.Duration
	Target   float64
}

// String formats s as Parse reads it: "10s:8000".
func (s Stage) String() string {
	return s.Duration.String() + ":" + strconv.FormatFloat(s.Target, 'f', -1, 64)
}

// ErrEmpty is returned by New when the stages hold no time at all.
var ErrEmpty = errors.New("schedule: no stages with a duration")

// Parse reads stages written as comma-separated DURATION:TARGET pairs, such as
// "5s:1000,10s:8000,5s:8000,5s:0": durations as time.ParseDuration reads them,
// targets as arrivals per second, at least 0.
func Parse(s string) ([]Stage, error) {
	var stages []Stage
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		ds, rs, ok := strings.Cut(part, ":")
		if !ok {
			return nil, fmt.Errorf("stage %q: want DURATION:RATE, such as 10s:8000", part)
		}
		d, err := time.ParseDuration(ds)
		if err != nil {
			return nil, fmt.Errorf("stage %q: %w", part, err)
		}
		r, err := strconv.ParseFloat(rs, 64)
		if err != nil {
			return nil, fmt.Errorf("stage %q: rate: %w", part, err)
		}
		stages = append(stages, Stage{Duration: d, Target: r})
	}
	return stages, nil
}

// segment is one stage in the units the arithmetic uses.
type segment struct {
	begin float64 // seconds from the start
	d     float64 // seconds, > 0
	from  float64 // rate at begin
	to    float64 // rate at begin+d
	base  float64 // arrivals due before begin
	n     float64 // arrivals due within the stage: (from+to)/2·d
}

// Schedule yields the due times of a load test's arrivals, in order. It is not
// safe for concurrent use: one goroutine, the driver's scheduler, calls Next.
type Schedule struct {
	segs  []segment // stages with a duration, in order
	total float64   // arrivals due in all
	next  int64     // the arrival Next returns next
	seg   int       // index into segs of the stage arrival next falls in, or beyond
}

// New returns the schedule that starts at startRate and runs through stages.
// Stages of zero duration change the rate at once. It returns ErrEmpty when no
// stage has a duration, and an error for a negative duration or rate.
func New(startRate float64, stages []Stage) (*Schedule, error) {
	if startRate < 0 || math.IsNaN(startRate) || math.IsInf(startRate, 0) {
		return nil, fmt.Errorf("schedule: start rate %v: want a number >= 0", startRate)
	}
	s := &Schedule{}
	var at, base float64
	from := startRate
	for _, st := range stages {
		if st.Duration < 0 {
			return nil, fmt.Errorf("schedule: stage %v: negative duration", st)
		}
		if st.Target < 0 || math.IsNaN(st.Target) || math.IsInf(st.Target, 0) {
			return nil, fmt.Errorf("schedule: stage %v: want a rate >= 0", st)
		}
		if st.Duration == 0 {
			from = st.Target
			continue
		}
		d := st.Duration.Seconds()
		n := (from + st.Target) / 2 * d
		s.segs = append(s.segs, segment{begin: at, d: d, from: from, to: st.Target, base: base, n: n})
		at += d
		base += n
		from = st.Target
	}
	if len(s.segs) == 0 {
		return nil, ErrEmpty
	}
	s.total = base
	return s, nil
}

// Constant returns the schedule of rate arrivals per second for d. It returns an
// error when d is not positive or rate is negative.
func Constant(rate float64, d time.Duration) (*Schedule, error) {
	if d <= 0 {
		return nil, fmt.Errorf("schedule: duration %v: want > 0", d)
	}
	return New(rate, []Stage{{Duration: d, Target: rate}})
}

// Duration returns the length of the schedule.
func (s *Schedule) Duration() time.Duration {
	last := s.segs[len(s.segs)-1]
	return seconds(last.begin + last.d)
}

// Expected returns how many arrivals the whole schedule holds (Next yields the
// whole number of them, rounded up).
func (s *Schedule) Expected() float64 { return s.total }

// RateAt returns the arrival rate at offset t from the start: 0 outside the
// schedule.
func (s *Schedule) RateAt(t time.Duration) float64 {
	x := t.Seconds()
	for _, g := range s.segs {
		if x >= g.begin && x < g.begin+g.d {
			return g.from + (g.to-g.from)*(x-g.begin)/g.d
		}
	}
	return 0
}

// Next returns the due time of the next arrival as an offset from the start, and
// false once the schedule has no more arrivals.
func (s *Schedule) Next() (time.Duration, bool) {
	c := float64(s.next)
	if c >= s.total {
		return 0, false
	}
	for s.seg < len(s.segs) && c >= s.segs[s.seg].base+s.segs[s.seg].n {
		s.seg++
	}
	if s.seg == len(s.segs) {
		return 0, false // rounding at the very end
	}
	g := s.segs[s.seg]
	s.next++
	return seconds(g.begin + g.offset(c-g.base)), true
}

// offset returns the time into the stage at which c arrivals of it are due: the
// root τ in [0, d] of from·τ + (to-from)/(2d)·τ² = c. It is written as
// 2c / (from + √(from² + 4kc)) so that it needs no special case when the rate is
// constant (k = 0) and loses no precision when from is large.
func (g segment) offset(c float64) float64 {
	if c <= 0 {
		return 0
	}
	k := (g.to - g.from) / (2 * g.d)
	disc := g.from*g.from + 4*k*c
	if disc < 0 {
		disc = 0 // c at the very end of a ramp down to 0, past it by rounding
	}
	den := g.from + math.Sqrt(disc)
	if den == 0 {
		return g.d
	}
	return min(2*c/den, g.d)
}

func seconds(x float64) time.Duration { return time.Duration(math.Round(x * 1e9)) }
