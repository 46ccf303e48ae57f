package pool

import (
	"math"
	"time"
)

// sample is the pool's counters at one instant; the controller works on the
// differences between two samples.
type sample struct {
	arrivals, completed, busyNanos int64
}

// controller turns counters into a capacity. It is a plain value, driven by
// Pool.control every Interval and by tests with made-up samples and
// intervals, so it needs no clock of its own.
type controller struct {
	cfg     *Config
	prev    sample
	primed  bool    // prev holds a sample
	rate    float64 // moving average of arrivals per second
	service float64 // moving average of seconds per task
}

// decide returns the next capacity and the unbounded target, given the
// capacity now and a sample taken dt after the previous one.
func (c *controller) decide(dt time.Duration, capNow int, s sample) (next, target int) {
	if !c.primed || dt <= 0 {
		c.prev, c.primed = s, true
		return capNow, capNow
	}
	secs := dt.Seconds()
	c.rate = c.average(c.rate, float64(s.arrivals-c.prev.arrivals)/secs)
	if done := s.completed - c.prev.completed; done > 0 {
		// With nothing completed the service time is unknown: keep the last.
		c.service = c.average(c.service, float64(s.busyNanos-c.prev.busyNanos)/1e9/float64(done))
	}
	c.prev = s

	// Little's law: work in flight = arrival rate × time in service.
	want := math.Ceil(c.rate * c.service * c.cfg.Headroom)
	target = clamp(int(min(want, float64(c.cfg.Max))), c.cfg.Min, c.cfg.Max)

	// Bounded steps: at most ×MaxGrowth up, ×MaxShrink down per interval.
	lo := int(math.Floor(float64(capNow) * c.cfg.MaxShrink))
	hi := int(math.Ceil(float64(capNow) * c.cfg.MaxGrowth))
	next = clamp(clamp(target, lo, hi), c.cfg.Min, c.cfg.Max)

	// Hysteresis: leave small changes alone, so the pool does not flap
	// around a steady load. Always move back within [Min, Max].
	if capNow >= c.cfg.Min && capNow <= c.cfg.Max &&
		math.Abs(float64(next-capNow)) <= c.cfg.Hysteresis*float64(capNow) {
		next = capNow
	}
	return next, target
}

// average is an exponentially weighted moving average; the first value is
// taken as it is.
func (c *controller) average(old, x float64) float64 {
	if old == 0 {
		return x
	}
	return c.cfg.Smoothing*x + (1-c.cfg.Smoothing)*old
}

func clamp(x, lo, hi int) int {
	return max(lo, min(x, hi))
}
