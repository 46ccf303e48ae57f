package main

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"rain/internal/alarm"
	"rain/loadtest/rainload/internal/hist"
	"rain/loadtest/rainload/internal/schedule"
)

// status is what became of one request: a status of docs/api.md, or one of the two
// ways a request can fail without one.
type status int

const (
	granted status = iota
	alreadyGranted
	soldOut
	notFound
	notStarted
	ended
	overloaded
	invalid
	unauthorized // 401: no user token, or one rain does not take (-user-secret)
	rateLimited  // 429: over a per-IP or per-user rate of rain's
	errStatus    // an HTTP answer that is not docs/api.md's: 5xx other than 503, or no known status
	transport    // no HTTP answer: connection error or timeout
	nStatus
)

// statusNames are the names in the summary and timeline, by status.
var statusNames = [nStatus]string{
	"granted", "already_granted", "sold_out", "not_found", "not_started", "ended",
	"overloaded", "invalid", "unauthorized", "rate_limited", "error", "transport",
}

// goodput reports whether s is an answer docs/api.md means as one (200, 404, 410, 425).
func (s status) goodput() bool { return s <= ended }

// accepted reports whether the server took the request on: everything but a shed
// (503 overloaded), a refusal for the rate (429) and no answer at all.
func (s status) accepted() bool { return s != overloaded && s != rateLimited && s != transport }

// ring is how many seconds of per-second counters exist at once: the one being
// filled, the one the monitor reads, and slack for late writers.
const ring = 4

// second holds the counters of one second of the run, reused every ring seconds.
type second struct {
	offered  atomic.Int64 // arrivals due this second
	dropped  atomic.Int64 // of them, dropped
	statuses [nStatus]atomic.Int64
	accepted hist.Hist // latency of accepted requests finished this second
}

// alarmFrom: the shortest wait schedule times with its alarm.
const alarmFrom = 50 * time.Microsecond

// arrival is one request handed from the scheduler to a connection.
type arrival struct {
	due  time.Duration // since driver.start
	user int64         // index into the user-id space
}

// driver runs one load test. The scheduler goroutine owns the fields under
// "scheduler only"; everything else is safe for concurrent use.
type driver struct {
	cfg   *config
	start time.Time    // when arrival offsets count from
	queue chan arrival // capacity cfg.maxInflight: sends never block
	conns sync.WaitGroup

	inflight atomic.Int64 // handed to the queue and not finished
	offered  atomic.Int64 // arrivals due so far
	dropped  atomic.Int64 // of them, dropped
	latency  [nStatus]hist.Hist
	lag      hist.Hist // how late the scheduler handed each arrival on
	codes    [600]atomic.Int64
	secs     [ring]second

	// scheduler only
	rng  *rand.Rand
	used int64 // new users handed out so far
}

func newDriver(cfg *config) *driver {
	return &driver{
		cfg:   cfg,
		queue: make(chan arrival, cfg.maxInflight),
		rng:   rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
	}
}

// startConns starts the connection goroutines; they return once the queue is
// closed and drained (see drain).
func (d *driver) startConns() {
	for range d.cfg.conns {
		d.conns.Go(func() { newConn(d).serve() })
	}
}

// schedule hands each arrival of s on at its due time until s ends (at
// s.Duration, even when its last arrival comes earlier) or ctx is done, and
// reports whether ctx ended it early. It sleeps between arrivals, and a
// wait of under a millisecond is timed by an alarm (internal/alarm): on Go's
// timer alone it would end at the process's next wake-up, up to a
// millisecond late when the process is idle, and the arrivals that came due
// meanwhile would go out together, at the moment an answer woke the
// process: not an open loop. Arrivals still late (a busy process) go out at
// once, and lag records by how much. A wait shorter than alarmFrom (arrivals
// more than 20,000 a second) keeps to Go's timer: the process is busy then,
// and its timers fire at its scheduler's next turn, without a wake-up each.
func (d *driver) schedule(ctx context.Context, s *schedule.Schedule) (early bool) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	al := alarm.New()
	if al != nil {
		defer al.Close()
	}
	due, more := s.Next()
	for n := 0; more; n++ {
		now := time.Since(d.start)
		if due > now {
			var ring <-chan struct{}
			if al != nil && due-now >= alarmFrom && due-now < time.Millisecond {
				al.Set(due - now)
				ring = al.C()
			}
			timer.Reset(due - now)
			select {
			case <-ctx.Done():
				return true
			case <-timer.C:
			case <-ring: // due, or an earlier wait's ring: the loop looks again
			}
			continue
		}
		if n%1024 == 0 && ctx.Err() != nil {
			return true // far behind, never sleeping: still stop on time
		}
		d.issue(due, now)
		due, more = s.Next()
	}
	// The schedule may end in a stage with no arrivals: it still lasts.
	if wait := s.Duration() - time.Since(d.start); wait > 0 {
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return true
		case <-timer.C:
		}
	}
	return false
}

// issue sends the arrival due at due, or drops it when cfg.maxInflight requests
// are in flight. now is the time since start.
func (d *driver) issue(due, now time.Duration) {
	sec := &d.secs[slot(due)]
	d.offered.Add(1)
	sec.offered.Add(1)
	// Only this goroutine adds to inflight, so it cannot pass the bound
	// between the check and the add.
	if d.inflight.Load() >= int64(d.cfg.maxInflight) {
		d.dropped.Add(1)
		sec.dropped.Add(1)
		return
	}
	d.inflight.Add(1)
	d.lag.Record(now - due)
	d.queue <- arrival{due: due, user: d.nextUser()}
}

// nextUser returns a user already sent with probability cfg.repeat, else a new one.
func (d *driver) nextUser() int64 {
	if d.used > 0 && d.cfg.repeat > 0 && d.rng.Float64() < d.cfg.repeat {
		return d.rng.Int64N(min(d.used, d.cfg.users))
	}
	u := d.used % d.cfg.users
	d.used++
	return u
}

// finish records a finished request: its status, its HTTP code (0 for none) and
// its latency from its due time. at is the time since start it finished.
func (d *driver) finish(st status, code int, latency, at time.Duration) {
	d.latency[st].Record(latency)
	if code > 0 && code < len(d.codes) {
		d.codes[code].Add(1)
	}
	sec := &d.secs[slot(at)]
	sec.statuses[st].Add(1)
	if st.accepted() {
		sec.accepted.Record(latency)
	}
	d.inflight.Add(-1)
}

// drain ends the run: no more arrivals; requests in flight get at most
// cfg.timeout more (see conn.deadline). It returns when every connection
// goroutine has.
func (d *driver) drain() {
	close(d.queue)
	d.conns.Wait()
}

// slot returns the index into secs of the second containing t.
func slot(t time.Duration) int {
	if t < 0 {
		t = 0
	}
	return int(t/time.Second) % ring
}

// count returns the number of requests finished with status st.
func (d *driver) count(st status) int64 { return int64(d.latency[st].Count()) }
