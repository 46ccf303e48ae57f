package grab

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
	"rain/internal/shard"
	"rain/internal/wait"
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
	// 21,000 grabs/s, 2 lanes 15,200, 4 lanes 13,600; with the linger, 2
	// lanes over HTTP 0.9x the grabs/s of 1 (docs/benchmarks.md, lever 4).
	lanesPerShard = 1
	maxBatch      = 128
	// lingerShortOfCPU bounds how long a lane waits for the claims it
	// expects before it sends a batch, which it does only while the
	// process is short of CPU (see linger and cpuWatch).
	lingerShortOfCPU = 1500 * time.Microsecond
	// queuePerShard bounds the claims waiting for one shard's lane: a bound
	// on memory, sized above the request places of a worker pool at its
	// defaults (the bulkhead holds a shard to its share of those first).
	queuePerShard = 4096
)

// LingerFull: a lane lingers only for a batch of fewer claims, and only
// until it holds what it expects, at most that many (see linger).
const LingerFull = 16

// claimReq is one claim in flight. Reused through reqPool.
type claimReq struct {
	ctx    context.Context
	keys   *rain.Keys
	user   string
	serial int64
	token  string // spill token, "" for pools of one sub-pool
	valid  int64  // spill reservation validity, ms
	res    lua.Claim
	err    error
	done   chan struct{} // capacity 1; receives once per use
}

var reqPool = sync.Pool{New: func() any { return &claimReq{done: make(chan struct{}, 1)} }}

// wait waits for the claim's answer and gives the request back to reqPool.
func (r *claimReq) wait() (lua.Claim, error) {
	<-r.done
	res, err := r.res, r.err
	r.ctx, r.keys, r.res, r.err = nil, nil, lua.Claim{}, nil
	reqPool.Put(r)
	return res, err
}

// batcher runs the claims of one shard: its bulkhead, breaker and lane.
type batcher struct {
	name string
	c    redis.UniversalClient
	reqs chan *claimReq
	stop <-chan struct{} // closed by Service.Close

	// budget bounds one batch's round trip (the shard's call budget); a
	// claim waits at most that for its batch, plus the batch before it and
	// the lane's linger (lingerShortOfCPU).
	budget time.Duration
	// form: how the grants made are written (Config.Form).
	form lua.Form
	// replicated: the shard runs with replicas (Sentinel), and each batch
	// waits for one to have it (WAIT) before its grants are answered.
	replicated bool
	// places, when set, reports the request places held and how many there
	// are (the worker pool's, Config.Places); share is this shard's share of
	// them, by weight. The bulkhead: see admit.
	places   func() (inUse, limit int64)
	share    func(limit int64) int64
	sent     atomic.Int64 // when the batch in flight was sent (unix ns); 0 when none is
	inflight atomic.Int64 // claims queued or in flight
	br       *breaker
	busy     atomic.Int64 // claims refused by the bulkhead, ever
	refused  atomic.Int64 // claims refused by the open breaker, ever
	failures atomic.Int64 // batches the shard did not answer, ever
	moved    atomic.Int64 // groups a cluster redirected (MOVED, ASK, TRYAGAIN), ever
	onBatch  func(shard string, claims int, took time.Duration, failed bool)

	// The lane's lingers (see linger), ever: made, the claims they took
	// in, and skipped because the process had CPU to spare (shortOfCPU).
	lingered, lingerClaims, lingerSkipped atomic.Int64

	// cluster names the cluster shard whose primary this batcher serves
	// ("" for a shard of its own); shards then leads redirects and says
	// whether a node has replicas.
	cluster string
	shards  *shard.Set

	// mark marks a sub-pool (its meta key) that may now hold a grant in
	// the shard's due index (see due.go).
	mark func(meta string)
	// cpu says whether the process is short of CPU (nil: never).
	cpu *cpuWatch
	// held says whether the shard must be sent no claim yet (Config.Held;
	// nil: never).
	held func() bool
}

// enqueue queues a claim for the shard's lane; its answer comes through the
// request's wait. A claim the shard's breaker or bulkhead refuses (see
// admit), or one queued when the lane's queue is full, does no Redis work:
// its error wraps errNotSent. Once queued, the lane answers it (with
// errNotSent if its ctx ends before its batch is sent); once sent, the
// answer is bounded by the budget, and an answer that arrives is never lost.
func (b *batcher) enqueue(ctx context.Context, k *rain.Keys, user string, serial int64, token string, valid int64) (*claimReq, error) {
	if !b.br.allow() {
		b.refused.Add(1)
		return nil, fmt.Errorf("%w: shard %s is unavailable (its breaker is open)", errNotSent, b.name)
	}
	if b.held != nil && b.held() {
		b.refused.Add(1)
		return nil, fmt.Errorf("%w: shard %s is unavailable (its durability is not known yet)", errNotSent, b.name)
	}
	now := time.Now().UnixNano()
	if err := b.admit(now); err != nil {
		b.busy.Add(1)
		return nil, fmt.Errorf("%w: %w", errNotSent, err)
	}
	select {
	case <-b.stop:
		return nil, fmt.Errorf("%w: service closed", errNotSent)
	default:
	}
	r := reqPool.Get().(*claimReq)
	r.ctx, r.keys, r.user, r.serial, r.token, r.valid = ctx, k, user, serial, token, valid
	b.inflight.Add(1)
	select {
	case b.reqs <- r:
		return r, nil
	default:
		b.inflight.Add(-1)
		b.busy.Add(1)
		r.ctx, r.keys = nil, nil
		reqPool.Put(r)
		return nil, fmt.Errorf("%w: shard %s has %d claims queued", errNotSent, b.name, cap(b.reqs))
	}
}

// admit is the shard's bulkhead: it refuses a claim (nothing is sent) only
// when the shard is not keeping up with the budget or would crowd the
// others out, never because a batch is late (invariant 10: a shard that
// answers, however slowly its fsync lands, serves its users):
//
//   - stalled: the batch in flight was sent longer than the budget ago: the
//     shard itself has not answered within its budget (a frozen or dead
//     shard; its breaker opens when that batch times out). A claim that
//     waited behind the batch before it is no sign of a stall: a shard that
//     answers every batch within the budget is never refused, however long
//     its claims queue (up to a budget behind the batch in flight);
//   - crowding: the shard holds more than its share of the request places
//     while they run short (over three quarters taken), so a shard that
//     stalls under a flood holds at most its share and the other shards'
//     grabs still find places.
//
// Claims do not hold workers while they wait (the worker pool runs a
// grab's task only until its claim is queued), so a stalled shard costs
// the others no worker.
func (b *batcher) admit(now int64) error {
	if at := b.sent.Load(); at != 0 && time.Duration(now-at) > b.budget {
		return fmt.Errorf("shard %s is stalled: its batch in flight has waited %v for an answer, over the budget of %v",
			b.name, time.Duration(now-at).Round(time.Millisecond), b.budget)
	}
	if b.places == nil {
		return nil
	}
	inUse, limit := b.places()
	if n := b.inflight.Load(); inUse > limit*3/4 && n >= b.share(limit) {
		return fmt.Errorf("shard %s has its share of the requests in flight (%d) while they run short", b.name, n)
	}
	return nil
}

// lane serves batches until stop is closed. Claims still queued then are
// answered with errNotSent before it returns. (Service.Close comes after the
// last grab has returned, so none is queued after that.)
func (b *batcher) lane() {
	var st laneState
	batch := make([]*claimReq, 0, maxBatch)
	// expect: the claims the lane expects in its next batch, at most
	// LingerFull (see linger).
	expect := 0
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		var first *claimReq
		select {
		case first = <-b.reqs:
		case <-b.stop:
			for {
				select {
				case r := <-b.reqs:
					r.err = fmt.Errorf("%w: service closed", errNotSent)
					b.inflight.Add(-1)
					r.done <- struct{}{}
				default:
					return
				}
			}
		}
		batch = b.drain(append(batch[:0], first))
		if len(batch) < expect && b.br.current() == breakerClosed {
			if b.shortOfCPU() {
				had := len(batch)
				batch = b.drain(b.linger(batch, expect, timer))
				took := len(batch) - had
				b.lingered.Add(1)
				b.lingerClaims.Add(int64(took))
			} else {
				b.lingerSkipped.Add(1)
			}
		}
		b.sent.Store(time.Now().UnixNano())
		b.run(batch, &st)
		b.sent.Store(0)
		b.inflight.Add(-int64(len(batch)))
		expect = min(len(batch)+len(b.reqs), LingerFull)
	}
}

// drain adds to batch the claims queued, up to maxBatch.
func (b *batcher) drain(batch []*claimReq) []*claimReq {
	for len(batch) < maxBatch {
		select {
		case r := <-b.reqs:
			batch = append(batch, r)
		default:
			return batch
		}
	}
	return batch
}

// linger waits up to lingerShortOfCPU for more claims while batch holds
// fewer than expect, and returns the batch with those that came. A lane
// lingers only while the process is short of CPU (shortOfCPU).
//
// Each batch costs its shard a fixed amount of work however many claims it
// holds: about 200 µs of Redis on the development machine, the kernel's
// fsync and writes above all, as much as 20 claims' own work or more
// (docs/benchmarks.md, "Where a round trip's Redis CPU goes"). In a closed
// loop of clients each claim answered is soon followed by its client's
// next one, so the lane expects, after a batch, as many claims as it
// answered plus those that queued while it was in flight, up to LingerFull
// (below). On cores that are all taken those claims take longer to come
// back than a batch takes to leave: without the wait the claims of one
// shard split into two cohorts that take turns (those queued behind the
// batch in flight, and those whose answers it carried), each batch half of
// what the shard has in flight, and every batch pays its fixed work for
// half what it could carry. Under a flood the queue already holds a full
// batch, and nothing waits. A claim waits at most lingerShortOfCPU for the
// lane, and never while the shard's breaker is not closed (its claims are
// then answered at once).
//
// The lane expects at most LingerFull claims, so it lingers only for a
// batch of fewer, and only until it holds what it expects. A longer wait
// idles the shard: on one shard at 64 connections, a lane that expected
// every claim it had answered waited for them while its Redis, whose only
// lane it is, had nothing to do. And in an open loop that is short of CPU
// the expectation fed itself: each linger made a larger batch, the larger
// batch a larger expectation and a longer linger, up to lingerShortOfCPU a
// batch, and the bursts of answers that came of them kept the process
// short of CPU. 16 is not where the fixed work stops mattering (at 16
// claims it is still more than half of a batch's cost) but where the
// measured trade between saturated throughput and the open loop came out
// best; 8 and 32 each did worse on one side of it (docs/benchmarks.md, "A
// linger toward 16 claims", with the figures).
func (b *batcher) linger(batch []*claimReq, expect int, timer *time.Timer) []*claimReq {
	timer.Reset(lingerShortOfCPU)
	defer timer.Stop()
	for len(batch) < expect {
		select {
		case r := <-b.reqs:
			batch = append(batch, r)
		case <-timer.C:
			return batch
		case <-b.stop:
			return batch
		}
	}
	return batch
}

// shortOfCPU reports whether the process is short of CPU (cpuWatch), the
// only time a lane lingers.
//
// With CPU to spare a lane sends at once. An open loop (phones, each on its
// own clock) sends at its own pace whatever the answers, and there a linger
// lengthened every batch's cycle, and every claim queued behind it waited
// for the cycle too. A linger of 200 µs with CPU to spare, made while the
// lingers took in half a claim or more on average, cost the open loop on
// one shard at a quarter of the saturated rate more than half its p50
// (docs/benchmarks.md, "A linger only short of CPU"), where its lingers
// each took in about one claim. A closed loop of a few clients (16
// connections on 4 shards) sent 5% fewer grabs a second without it.
func (b *batcher) shortOfCPU() bool { return b.cpu != nil && b.cpu.short.Load() }

// group is the claims of one batch on one sub-pool: one claim_many script.
type group struct {
	keys   *rain.Keys
	reqs   []*claimReq
	claims []lua.ClaimArg
	args   []any
	cmd    *redis.Cmd

	// The script's answer, and whether a replica has it (WAIT), as send
	// left them.
	res  []lua.Claim
	errs []error
	err  error
	wait error // not nil: the shard has replicas and none confirmed the batch in time
}

// laneState is a lane's buffers, reused from batch to batch.
type laneState struct {
	groups []group
	ptrs   []*group
}

// run sends one batch, one claim_many per sub-pool in one pipeline, and
// answers every claim in it. A batch that meets the network's errors trips
// the shard's breaker; with the breaker open the claims queued are answered
// at once, unsent.
func (b *batcher) run(batch []*claimReq, st *laneState) {
	groups, valid := b.group(batch, st)
	if len(groups) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.budget)
	defer cancel()
	sent := time.Now()
	st.ptrs = st.ptrs[:0]
	for i := range groups {
		st.ptrs = append(st.ptrs, &groups[i])
	}
	b.send(ctx, b.c, st.ptrs, valid, false)
	failed, answered := false, 0
	for _, g := range st.ptrs {
		failed = b.read(ctx, g, valid) || failed
		answered += len(g.reqs)
	}
	took := time.Since(sent)
	if failed && b.cluster != "" {
		b.shards.Reload(ctx, b.cluster) // a primary that stopped answering may have failed over
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

// group sorts the claims of a batch by sub-pool, one group (one claim_many)
// each, in st's reused buffers, and answers at once, unsent, the claims
// whose ctx has ended or whose shard's breaker is open (or probing). valid
// is the spill reservations' validity, the same for every claim of a
// service.
func (b *batcher) group(batch []*claimReq, st *laneState) (groups []group, valid int64) {
	open := b.br.current() != breakerClosed // open, or a probe is out
	groups = st.groups[:0]
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil || open {
			if open {
				err = fmt.Errorf("shard %s is unavailable (its breaker is open)", b.name)
			}
			r.err = fmt.Errorf("%w: %w", errNotSent, err)
			r.done <- struct{}{}
			continue
		}
		valid = r.valid
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
	return groups, valid
}

// send runs the groups' claim_many scripts on c in one pipeline (each
// after ASKING when asking: the slot is moving to c's node) and, when c's
// node has replicas, WAIT 1 after them on the same connection, with the
// scripts' fence on (a claim answered with an earlier grant then writes, so
// the WAIT covers that grant too: see claim_many.lua). It leaves each
// group's answer in it.
func (b *batcher) send(ctx context.Context, c redis.UniversalClient, gs []*group, valid int64, asking bool) {
	replicated := b.replicatedOn(c)
	pipe := c.Pipeline()
	for _, g := range gs {
		if asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		g.cmd = lua.ClaimManyCmd(ctx, pipe, g.keys, valid, replicated, b.form, g.claims, g.args)
	}
	var wait *redis.IntCmd
	if replicated {
		// Every write of the batch went on this connection before WAIT:
		// its answer is how many replicas have all of them.
		wait = redis.NewIntCmd(ctx, "wait", 1, (b.budget / 2).Milliseconds())
		_ = pipe.Process(ctx, wait)
	}
	_, _ = pipe.Exec(ctx) // errors are per command, read below
	for _, g := range gs {
		g.res, g.errs, g.err = lua.ParseClaimMany(g.cmd, len(g.reqs))
		g.cmd, g.wait = nil, nil
		if wait != nil && (wait.Err() != nil || wait.Val() < 1) {
			g.wait = fmt.Errorf("%w (WAIT answered %d, %v)", errNotReplicated, wait.Val(), wait.Err())
		}
	}
}

// replicatedOn reports whether writes through c (the batcher's own client,
// or a cluster node's a redirect leads to) wait for a replica.
func (b *batcher) replicatedOn(c redis.UniversalClient) bool {
	if b.cluster == "" {
		return b.replicated
	}
	node, ok := c.(*redis.Client)
	return ok && b.shards.NodeReplicated(b.cluster, node.Options().Addr)
}

// redirected reports whether err is a cluster's answer that the slot is
// elsewhere (MOVED), moving (ASK), or that some of the script's keys moved
// while it ran (TRYAGAIN): nothing ran, the claims go where it says.
func redirected(err error) bool {
	return redis.HasErrorPrefix(err, "MOVED") || redis.HasErrorPrefix(err, "ASK") || redis.HasErrorPrefix(err, "TRYAGAIN")
}

// maxRedirects bounds the redirects one group follows within its batch.
const maxRedirects = 5

// redirect follows a cluster's redirect of g, within the batch's budget:
// MOVED sends g to the slot's owner (and has the cluster client read the
// slot map again, so the next claims go there at once), ASK to the node the
// slot is moving to (after ASKING), TRYAGAIN (keys of the slot half moved)
// to the same node again after a moment. Every claim answers a re-send as
// its first run did, so following a redirect grants nothing twice.
func (b *batcher) redirect(ctx context.Context, g *group, valid int64) {
	c, asking := b.c, false
	b.moved.Add(1)
	for try := 0; try < maxRedirects && redirected(g.err); try++ {
		f := strings.Fields(g.err.Error())
		switch {
		case len(f) == 3 && f[0] == "MOVED":
			b.shards.Reload(ctx, b.cluster)
			c, asking = b.shards.Node(b.cluster, shard.RedirectAddr(f[2])), false
		case len(f) == 3 && f[0] == "ASK":
			c, asking = b.shards.Node(b.cluster, shard.RedirectAddr(f[2])), true
		default: // TRYAGAIN: the same node, after a moment
			if wait.For(ctx, 20*time.Millisecond) != nil {
				return
			}
		}
		b.send(ctx, c, []*group{g}, valid, asking)
		if lua.IsNoScript(g.err) { // a node that never ran rain's scripts (a new primary): nothing ran
			if g.err = lua.LoadScripts(ctx, c); g.err == nil {
				b.send(ctx, c, []*group{g}, valid, asking)
			}
		}
	}
}

// read sets the answer of every claim of g from its claim_many's reply: a
// shard whose script cache was empty (NOSCRIPT: nothing ran) gets the
// scripts and the group again, a slot that moved (a cluster's MOVED, ASK,
// TRYAGAIN) is followed to its owner (see redirect), and a grant no replica
// confirmed (WAIT) is an unknown outcome. It reports whether the shard
// failed to answer (the network's error, not a script's).
func (b *batcher) read(ctx context.Context, g *group, valid int64) (failed bool) {
	if lua.IsNoScript(g.err) {
		if g.err = lua.LoadScripts(ctx, b.c); g.err == nil {
			b.send(ctx, b.c, []*group{g}, valid, false)
		}
	}
	if b.cluster != "" && redirected(g.err) {
		b.redirect(ctx, g, valid)
	}
	var rerr redis.Error
	failed = g.err != nil && !errors.As(g.err, &rerr)
	held := g.err != nil // may have granted: unknown
	for k, r := range g.reqs {
		switch {
		case g.err != nil:
			r.err = g.err
		case g.errs[k] == nil && (g.res[k].Outcome == lua.Granted || g.res[k].Outcome == lua.Already) && g.wait != nil:
			r.err = g.wait
		default:
			r.res, r.err = g.res[k], g.errs[k]
		}
		held = held || g.errs == nil || g.errs[k] != nil || g.res[k].Outcome == lua.Granted
	}
	if held && b.mark != nil {
		b.mark(g.keys.Meta) // a grant now held there: the reaper's (see due.go)
	}
	return failed
}
