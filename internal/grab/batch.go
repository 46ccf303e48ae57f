package grab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/lua"
)

// Batching of claims: concurrent grabs bound for one shard share a round
// trip. Each shard has a lane; the lane takes the first claim waiting, drains
// whatever else is queued (up to maxBatch), and sends them as one pipeline of
// claim_many scripts, one per sub-pool. Under light load a batch is one claim and
// costs what a plain call costs; under a flood the batch grows while the
// previous one is in flight, and the syscalls per grab fall on both sides.
// Each claim is still its own atomic script: batching changes no semantics.
// go-redis sends a pipeline whose answers were lost again, whole; every claim
// answers a re-send as it answered the first run (same serial, same token),
// so a retried batch grants nothing twice.
const (
	// lanesPerShard: one batch in flight per shard. Every batch costs its
	// shard an fsync (appendfsync always) before it answers, and the claims
	// that arrive meanwhile make the next batch: with one lane they wait
	// for it, with more they leave in batches of their own. Measured with
	// BenchmarkGrab (4 shards, always, 32 goroutines, 2 cores): 1 lane
	// 21,000 grabs/s, 2 lanes 15,200, 4 lanes 13,600.
	lanesPerShard = 1
	maxBatch      = 128
	// queuePerShard bounds the claims waiting for one shard's lane.
	queuePerShard = 4 * maxBatch
)

// claimReq is one claim in flight. Reused through reqPool.
type claimReq struct {
	ctx    context.Context
	keys   *lua.Keys
	user   string
	serial int64
	token  string // spill token, "" for pools of one sub-pool
	valid  int64  // spill reservation validity, ms
	res    lua.Claim
	err    error
	done   chan struct{} // capacity 1; receives once per use
}

var reqPool = sync.Pool{New: func() any { return &claimReq{done: make(chan struct{}, 1)} }}

// batcher runs the claims of one shard: its bulkhead, breaker and lane.
type batcher struct {
	name string
	c    *redis.Client
	reqs chan *claimReq
	stop <-chan struct{} // closed by Service.Close

	// budget bounds one batch's round trip (the shard's call budget); a
	// claim waits at most that for its batch, plus the batch before it.
	budget time.Duration
	// replicated: the shard runs with replicas (Sentinel), and each batch
	// waits for one to have it (WAIT) before its grants are answered.
	replicated bool
	// limit, when set, is the most claims this shard may have queued or in
	// flight at once while its current batch is late (out for longer than
	// lateAfter): its share of the worker pool, so a shard that stalls
	// holds at most its share of the workers (a bulkhead), while a shard
	// that only works harder (an audit reading pages) is not cut short.
	limit     func() int
	lateAfter time.Duration
	sentAt    atomic.Int64 // when the batch in flight was sent (unix ns); 0 when none is
	inflight  atomic.Int64 // claims queued or in flight
	br        *breaker
	busy      atomic.Int64 // claims refused by the bulkhead, ever
	refused   atomic.Int64 // claims refused by the open breaker, ever
	failures  atomic.Int64 // batches the shard did not answer, ever
	onBatch   func(shard string, claims int, took time.Duration, failed bool)
}

// errNotSent wraps the error of a claim that never reached its shard.
var errNotSent = errors.New("claim not sent")

// errNotReplicated is the error of a grant its shard made but no replica
// confirmed in time: a failover could lose it, so its outcome is unknown.
var errNotReplicated = errors.New("no replica confirmed the grant in time")

// claim queues a claim and waits for its answer. A claim the shard's
// bulkhead or open breaker refuses, or whose ctx is done before its batch is
// sent, does no Redis work (its error wraps errNotSent); once sent, the
// caller waits for the answer (bounded by the budget), so an answer that
// arrives is never lost.
func (b *batcher) claim(ctx context.Context, k *lua.Keys, user string, serial int64, token string, valid int64) (lua.Claim, error) {
	if b.limit != nil {
		if n := b.inflight.Add(1); n > int64(b.limit()) && b.late() {
			b.inflight.Add(-1)
			b.busy.Add(1)
			return lua.Claim{}, fmt.Errorf("%w: shard %s has its share of the work in flight", errNotSent, b.name)
		}
		defer b.inflight.Add(-1)
	}
	if !b.br.allow() {
		b.refused.Add(1)
		return lua.Claim{}, fmt.Errorf("%w: shard %s is unavailable (its breaker is open)", errNotSent, b.name)
	}
	r := reqPool.Get().(*claimReq)
	r.ctx, r.keys, r.user, r.serial, r.token, r.valid = ctx, k, user, serial, token, valid
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		r.ctx, r.keys = nil, nil
		reqPool.Put(r)
		return lua.Claim{}, fmt.Errorf("%w: %w", errNotSent, ctx.Err())
	case <-b.stop:
		r.ctx, r.keys = nil, nil
		reqPool.Put(r)
		return lua.Claim{}, fmt.Errorf("%w: service closed", errNotSent)
	}
	<-r.done
	res, err := r.res, r.err
	r.ctx, r.keys, r.res, r.err = nil, nil, lua.Claim{}, nil
	reqPool.Put(r)
	return res, err
}

// late reports whether the batch in flight has been out for longer than
// lateAfter: the shard may be stalling.
func (b *batcher) late() bool {
	at := b.sentAt.Load()
	return at != 0 && time.Since(time.Unix(0, at)) > b.lateAfter
}

// lane serves batches until stop is closed. Claims still queued then are
// answered with errNotSent before it returns. (Service.Close comes after the
// last grab has returned, so none is queued after that.)
func (b *batcher) lane() {
	var st laneState
	batch := make([]*claimReq, 0, maxBatch)
	for {
		var first *claimReq
		select {
		case first = <-b.reqs:
		case <-b.stop:
			for {
				select {
				case r := <-b.reqs:
					r.err = fmt.Errorf("%w: service closed", errNotSent)
					r.done <- struct{}{}
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		b.run(batch, &st)
	}
}

// group is the claims of one batch on one sub-pool: one claim_many script.
type group struct {
	keys   *lua.Keys
	reqs   []*claimReq
	claims []lua.ClaimArg
	args   []any
	cmd    *redis.Cmd
}

// laneState is a lane's buffers, reused from batch to batch.
type laneState struct {
	groups []group
}

// run sends one batch, one claim_many per sub-pool in one pipeline, and
// answers every claim in it. A batch that meets the network's errors trips
// the shard's breaker; with the breaker open the claims queued are answered
// at once, unsent.
func (b *batcher) run(batch []*claimReq, st *laneState) {
	ctx, cancel := context.WithTimeout(context.Background(), b.budget)
	defer cancel()
	open := b.br.current() != breakerClosed // open, or a probe is out
	groups := st.groups[:0]                 // reused with their buffers
	var valid int64
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil || open {
			if open {
				err = fmt.Errorf("shard %s is unavailable (its breaker is open)", b.name)
			}
			r.err = fmt.Errorf("%w: %w", errNotSent, err)
			r.done <- struct{}{}
			continue
		}
		valid = r.valid // the same for every claim of a service
		gi := -1
		for i := range groups {
			if groups[i].keys == r.keys {
				gi = i
				break
			}
		}
		if gi < 0 {
			if len(groups) < cap(groups) {
				groups = groups[:len(groups)+1]
			} else {
				groups = append(groups, group{})
			}
			gi = len(groups) - 1
			g := &groups[gi]
			g.keys, g.reqs, g.claims = r.keys, g.reqs[:0], g.claims[:0]
		}
		g := &groups[gi]
		g.reqs = append(g.reqs, r)
		g.claims = append(g.claims, lua.ClaimArg{User: r.user, Serial: r.serial, Token: r.token})
	}
	st.groups = groups
	if len(groups) == 0 {
		return
	}
	pipe := b.c.Pipeline()
	for i := range groups {
		g := &groups[i]
		g.cmd = lua.ClaimManyCmd(ctx, pipe, g.keys, valid, g.claims, g.args)
	}
	var wait *redis.IntCmd
	if b.replicated {
		// Every write of the batch went on this connection before WAIT:
		// its answer is how many replicas have all of them.
		wait = redis.NewIntCmd(ctx, "wait", 1, (b.budget / 2).Milliseconds())
		_ = pipe.Process(ctx, wait)
	}
	sent := time.Now()
	b.sentAt.Store(sent.UnixNano())
	_, _ = pipe.Exec(ctx) // errors are per command, read below
	b.sentAt.Store(0)
	took := time.Since(sent)
	failed, answered := false, 0
	for i := range groups {
		g := &groups[i]
		claims, errs, err := lua.ParseClaimMany(g.cmd, len(g.reqs))
		if lua.IsNoScript(err) {
			// A restarted shard has an empty script cache: load and run
			// again. Nothing ran for these claims, so running them is safe.
			if err = lua.LoadScripts(ctx, b.c); err == nil {
				claims, errs, err = lua.ClaimMany(ctx, b.c, g.keys, valid, g.claims)
			}
		}
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			failed = true // the network's error: the shard did not answer
		}
		replicated := wait == nil || (wait.Err() == nil && wait.Val() >= 1)
		answered += len(g.reqs)
		for k, r := range g.reqs {
			switch {
			case err != nil:
				r.err = err
			case errs[k] == nil && claims[k].Outcome == lua.Granted && !replicated:
				r.err = fmt.Errorf("%w (WAIT answered %d, %v)", errNotReplicated, wait.Val(), wait.Err())
			default:
				r.res, r.err = claims[k], errs[k]
			}
		}
		g.cmd = nil
	}
	// The breaker and the metrics see the batch before its callers do: a
	// caller's next claim meets the breaker as this batch left it, and a
	// scrape after an answer counts the batch.
	b.br.done(failed)
	if failed {
		b.failures.Add(1)
	}
	if b.onBatch != nil {
		b.onBatch(b.name, answered, took, failed)
	}
	for i := range groups {
		for _, r := range groups[i].reqs {
			r.done <- struct{}{}
		}
	}
}
