// Package pool runs every grab on one ants worker pool whose size follows the
// load, and refuses at once what it cannot serve in time.
//
// In a red-packet rain the offered load jumps a hundredfold in a second.
// Unbounded goroutines then pile up on Redis until every request times out;
// a fixed small pool queues them until every request times out. Pool keeps
// the work in flight near what the shards can absorb, from Little's law:
// capacity = arrival rate × service time × headroom, re-estimated every
// Config.Interval, clamped to [Min, Max], changed with ants' Tune in bounded
// steps and only when the change is large enough (hysteresis), so it does not
// flap. Callers beyond the workers wait in a bounded queue (Admit counts the
// places; the callers wait inside ants); past that, Do returns ErrOverloaded
// in microseconds and the HTTP layer answers 503 with Retry-After. Accepted
// requests keep a low tail latency instead of everyone timing out.
//
// A request holds a place from Admit to Leave, and a worker only while its
// task runs: a grab's task queues its claim at a shard and returns, and the
// request waits for the shard's answer off the pool (internal/grab). So a
// shard that stalls holds places, which the grab service bounds per shard,
// but never the workers the other shards' grabs run on.
//
// A panic in a task is recovered, counted and logged once per panic; Do
// returns ErrPanicked and the pool keeps serving.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"
)

// Errors returned by Do.
var (
	// ErrOverloaded is returned when every worker is busy and the queue is
	// full: the task was not run.
	ErrOverloaded = errors.New("pool: overloaded")
	// ErrPanicked is returned when the task panicked; the panic was
	// recovered, counted and logged.
	ErrPanicked = errors.New("pool: task panicked")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("pool: closed")
)

// Defaults of Config's bounds, which rain serve's flags show.
const (
	DefaultMin   = 32
	DefaultMax   = 1024
	DefaultQueue = 1024
)

// Config tunes a Pool. Zero fields take the documented defaults.
type Config struct {
	// Min and Max bound the capacity (workers). Defaults DefaultMin and
	// DefaultMax.
	Min, Max int
	// Queue is how many more requests than workers may hold a place at
	// once (waiting for a worker, or for their shard's answer after their
	// task) before Admit sheds. Default DefaultQueue; negative means none
	// (shed as soon as every worker's place is taken).
	Queue int
	// Interval between two resizing decisions. Default 500ms.
	Interval time.Duration
	// Headroom multiplies the Little's-law estimate. Default 2.
	Headroom float64
	// Smoothing is the weight of the newest interval in the moving averages
	// of arrival rate and service time, in (0, 1]. Default 0.5.
	Smoothing float64
	// MaxGrowth and MaxShrink bound one step: the capacity at most doubles
	// (×2) and at most loses a quarter (×0.75) per interval, by default.
	MaxGrowth, MaxShrink float64
	// Hysteresis is the relative change below which the capacity is left
	// alone. Default 0.1 (10%).
	Hysteresis float64
	// Logger receives panics and resizes (at debug). Default: discard.
	Logger *slog.Logger
}

func (c *Config) init() error {
	if c.Min == 0 {
		c.Min = DefaultMin
	}
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	if c.Interval == 0 {
		c.Interval = 500 * time.Millisecond
	}
	if c.Headroom == 0 {
		c.Headroom = 2
	}
	if c.Smoothing == 0 {
		c.Smoothing = 0.5
	}
	if c.MaxGrowth == 0 {
		c.MaxGrowth = 2
	}
	if c.MaxShrink == 0 {
		c.MaxShrink = 0.75
	}
	if c.Hysteresis == 0 {
		c.Hysteresis = 0.1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Min < 1 || c.Max < c.Min:
		return fmt.Errorf("pool: min %d and max %d: want 1 ≤ min ≤ max", c.Min, c.Max)
	case c.Max > math.MaxInt32:
		return fmt.Errorf("pool: max %d too large", c.Max)
	case c.Smoothing < 0 || c.Smoothing > 1:
		return fmt.Errorf("pool: smoothing %v not in (0, 1]", c.Smoothing)
	case c.MaxGrowth < 1 || c.MaxShrink <= 0 || c.MaxShrink > 1:
		return fmt.Errorf("pool: growth %v and shrink %v: want growth ≥ 1, 0 < shrink ≤ 1", c.MaxGrowth, c.MaxShrink)
	}
	return nil
}

// Pool is a resizing ants pool. Create it with New, stop it with Close.
type Pool struct {
	cfg  Config
	ants *ants.PoolWithFuncGeneric[*task] // runs Pool.run on each task

	arrivals  atomic.Int64 // Admit calls, ever
	admitted  atomic.Int64 // places held: admitted and not yet left
	completed atomic.Int64 // tasks run to the end (or panicked), ever
	busyNanos atomic.Int64 // total time tasks ran, ever
	shed      atomic.Int64 // Do calls refused with ErrOverloaded, ever
	panics    atomic.Int64 // tasks that panicked, ever
	target    atomic.Int64 // the controller's last target

	ctl  controller    // owned by the control goroutine (and tests)
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the control goroutine exits
	once sync.Once     // guards Close
}

// New starts a pool at Min workers and its controller.
func New(cfg Config) (*Pool, error) {
	if err := cfg.init(); err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, stop: make(chan struct{}), done: make(chan struct{})}
	// Admit bounds the callers (one task each at a time) to the workers plus
	// the queue, so ants itself never refuses: a task's answer reaches its
	// caller just before ants puts the worker back on its idle list, and a
	// caller admitted in that instant waits it out instead of being shed
	// with a place in hand.
	a, err := ants.NewPoolWithFuncGeneric(cfg.Min, p.run,
		ants.WithPanicHandler(p.antsPanic), ants.WithLogger(discard{}))
	if err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	p.ants = a
	p.target.Store(int64(cfg.Min))
	p.ctl = controller{cfg: &p.cfg}
	go p.control()
	return p, nil
}

// Do runs fn on a worker and waits for it to finish: Admit, Run, Leave. It
// returns ErrOverloaded at once when every place is taken, ErrPanicked if
// fn panicked, ErrClosed after Close, and ctx's error when ctx ends first.
// fn gets ctx; if ctx has ended by the time a worker picks the task up (the
// client has gone), fn is not called at all.
func (p *Pool) Do(ctx context.Context, fn func(ctx context.Context)) error {
	if !p.Admit() {
		return ErrOverloaded
	}
	defer p.Leave()
	return p.Run(ctx, fn)
}

// Admit takes a place for one request, or reports false at once (counted
// as shed) when there is none: the places are the workers plus the queue.
// It costs two atomic adds, so the HTTP layer calls it as a request
// arrives, before reading its body, and an overload is refused for almost
// nothing. A caller admitted may Run tasks, and must Leave once, when it
// has answered.
func (p *Pool) Admit() bool {
	p.arrivals.Add(1)
	if p.admitted.Add(1) > p.limit() {
		p.admitted.Add(-1)
		p.shed.Add(1)
		return false
	}
	return true
}

// Leave gives back an admitted caller's place.
func (p *Pool) Leave() { p.admitted.Add(-1) }

// Places returns the places held now and how many there are (the workers
// plus the queue): the grab service holds a shard that is late to its share
// of them once they run short.
func (p *Pool) Places() (inUse, limit int64) { return p.admitted.Load(), p.limit() }

// Run runs fn on a worker for an admitted caller and waits for it, as Do.
// The worker is free again when fn returns; the caller's place is not,
// until it Leaves.
//
// A caller waiting in the queue waits inside ants, which cannot be woken by
// ctx: it leaves when a worker frees up (the queue is bounded, so that is at
// most Queue × service time / capacity), and then does no work.
func (p *Pool) Run(ctx context.Context, fn func(ctx context.Context)) error {
	return p.RunTask(ctx, funcTask(fn))
}

// Task is work RunTask runs on a worker: what Run's function is, as a
// value the caller may keep and reuse (a grab's task allocates nothing).
type Task interface {
	Run(ctx context.Context)
}

// funcTask is a function as a Task.
type funcTask func(ctx context.Context)

func (f funcTask) Run(ctx context.Context) { f(ctx) }

// RunTask is Run of a Task: fn is tk.Run.
func (p *Pool) RunTask(ctx context.Context, tk Task) error {
	t := taskPool.Get().(*task)
	t.ctx, t.fn = ctx, tk
	err := p.ants.Invoke(t)
	if err != nil {
		t.ctx, t.fn = nil, nil
		taskPool.Put(t)
	}
	switch {
	case errors.Is(err, ants.ErrPoolClosed):
		return ErrClosed
	case err != nil:
		return fmt.Errorf("pool: submit: %w", err)
	}
	select {
	case err := <-t.done:
		t.ctx, t.fn = nil, nil
		taskPool.Put(t) // the worker is done with it
		return err
	case <-ctx.Done():
		return ctx.Err() // the worker still holds t: it is not reused
	}
}

// task is one Do in flight. Reused through taskPool once its answer is read.
type task struct {
	ctx  context.Context
	fn   Task
	done chan error // capacity 1: the worker never blocks on it
}

var taskPool = sync.Pool{New: func() any { return &task{done: make(chan error, 1)} }}

// limit is how many places there are: the workers plus the queue.
func (p *Pool) limit() int64 {
	return int64(p.ants.Cap()) + int64(max(p.cfg.Queue, 0))
}

// run is the task as a worker runs it.
func (p *Pool) run(t *task) {
	ctx, fn := t.ctx, t.fn
	if err := ctx.Err(); err != nil {
		t.done <- err
		return
	}
	start := time.Now()
	defer func() {
		p.busyNanos.Add(int64(time.Since(start)))
		p.completed.Add(1)
		if r := recover(); r != nil {
			p.panics.Add(1)
			p.cfg.Logger.Error("task panicked; recovered", "panic", fmt.Sprint(r))
			t.done <- ErrPanicked
			return
		}
		t.done <- nil
	}()
	fn.Run(ctx)
}

// antsPanic is ants' backstop: run recovers every panic itself, so this
// fires only if ants' own code panics.
func (p *Pool) antsPanic(r any) {
	p.panics.Add(1)
	p.cfg.Logger.Error("worker panicked outside a task; recovered", "panic", fmt.Sprint(r))
}

// control resizes the pool every Interval until Close.
func (p *Pool) control() {
	defer close(p.done)
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			p.step(now.Sub(last))
			last = now
		}
	}
}

// step takes one resizing decision over an interval of length dt.
func (p *Pool) step(dt time.Duration) {
	capNow := p.ants.Cap()
	next, target := p.ctl.decide(dt, capNow, sample{
		arrivals:  p.arrivals.Load(),
		completed: p.completed.Load(),
		busyNanos: p.busyNanos.Load(),
	})
	p.target.Store(int64(target))
	if next != capNow {
		p.ants.Tune(next)
		p.cfg.Logger.Debug("pool resized", "from", capNow, "to", next, "target", target)
	}
}

// Close stops the controller and drains the pool: tasks running finish, and
// Close waits up to timeout for them. It returns an error if they did not
// finish in time. Call it after the HTTP server has stopped.
func (p *Pool) Close(timeout time.Duration) error {
	var err error
	p.once.Do(func() {
		close(p.stop)
		<-p.done
		if e := p.ants.ReleaseTimeout(timeout); e != nil {
			err = fmt.Errorf("pool: drain: %w", e)
		}
	})
	return err
}

// Cap is the number of workers the pool may run now.
func (p *Pool) Cap() int { return p.ants.Cap() }

// Stats is a snapshot for metrics.
type Stats struct {
	Capacity, Running, Waiting int
	Target                     int
	Arrivals, Shed, Panics     int64
}

// Stats returns a snapshot.
func (p *Pool) Stats() Stats {
	return Stats{
		Capacity: p.ants.Cap(),
		Running:  p.ants.Running(),
		Waiting:  p.ants.Waiting(),
		Target:   int(p.target.Load()),
		Arrivals: p.arrivals.Load(),
		Shed:     p.shed.Load(),
		Panics:   p.panics.Load(),
	}
}

// discard silences ants' logger; rain logs what matters itself.
type discard struct{}

func (discard) Printf(string, ...any) {}
