// Package settle hands every grant to the wallet side, exactly once in
// effect, through the sub-pools' outbox streams.
//
// A Worker reads each shard's outbox streams with a Redis consumer group, in
// batches of up to Config.Batch entries per stream (two reads of its own
// pending ones: nextPages), every stream of a shard at once, and for every
// batch, in parts of up to Config.Batch grants (an
// entry of rain serve --outbox batch holds a batch's grants), in this
// order:
//
//  1. confirms the part's grants (one confirm_many script): from then on
//     the reaper can never release them. A grant the reaper released first
//     is not paid.
//  2. delivers them to the Sink (internal/postgres, internal/ledger's
//     file, internal/webhook's wallet) in one call, which dedupes by
//     serial.
//  3. acknowledges the entries settled and deletes them from the stream
//     (XACK and XDEL, one round trip), so an outbox holds only what is
//     unsettled.
//
// Confirm comes before delivery on purpose: the other order lets the reaper
// release a grant between the payout and the confirm, and the same cents
// would then be paid and back in the stock. A crash anywhere leaves the entry
// pending: the worker itself re-reads its pending entries, and entries
// pending on a dead consumer for Config.ClaimAfter are taken over
// (XAUTOCLAIM). Confirm is idempotent and sinks dedupe by serial, so a
// redelivery pays nothing twice. Release entries are acknowledged as they
// come: a released grant is not paid.
package settle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
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

// SubPools lists the sub-pools to settle (internal/catalog's Catalog does).
type SubPools interface {
	SubPools(ctx context.Context) ([]rain.SubPoolRef, error)
}

// Config tunes a Worker. Zero fields take the documented defaults.
type Config struct {
	// Group is the consumer group. Default "settle".
	Group string
	// Consumer names this worker in the group; give each process its own.
	// Default hostname-pid.
	Consumer string
	// Batch is the most entries read per stream per call, settled as one
	// batch (a pass's two reads of the worker's own pending entries of a
	// stream as one: nextPages), and the most grants one confirm script
	// and one delivery take (an entry may hold a batch's grants). Default
	// 500.
	Batch int64
	// Block is how long one read waits for new entries. Default 1s.
	Block time.Duration
	// ClaimAfter is how long an entry stays pending on another consumer
	// before this one takes it over. Default 30s.
	ClaimAfter time.Duration
	// Refresh is how often the list of outbox streams is read again, to pick
	// up new pools. Default 2s.
	Refresh time.Duration
	// RetryDelay is the pause after a pass over a shard that failed (a
	// read of its outboxes); it doubles with each pass that fails again, up
	// to MaxRetryDelay, and is back to RetryDelay after one that does not.
	// An outbox whose own read failed waits the same way on its own, the
	// shard's others read meanwhile (shardLoop.paused); an entry whose
	// confirm, delivery or acknowledgment failed waits on its own
	// (Worker.retries). So one grant or sub-pool that keeps failing never
	// makes the shard's other grants wait past their hold. Default 1s.
	RetryDelay time.Duration
	// MaxRetryDelay bounds that backoff. Default 15s.
	MaxRetryDelay time.Duration
	// Held, when set, says whether a shard must not be settled yet: its
	// durability is not known (it did not answer rain settle's check at
	// start, under --durability strict), and a confirm there could be lost.
	Held func(shard string) bool
	// DeliverTimeout bounds one batch's delivery to the sink: a sink that
	// hangs (a lock in the database, a wallet that never answers) fails
	// the batch after it, which is then delivered again. Default 2 minutes
	// (a webhook's retries and Retry-After waits fit in it).
	DeliverTimeout time.Duration
	// Patience bounds how long a pass over a shard waits for one outbox's
	// batch (its confirms, delivery and acknowledgment) before it goes on
	// without it: a delivery that hangs (up to DeliverTimeout) finishes on
	// its own, its entries skipped by the passes meanwhile, and the
	// shard's other grants are confirmed and paid within their hold. At
	// most maxCalls calls to the sink are in flight per shard; a batch
	// that finds none free within Patience confirms its grants and leaves
	// their delivery for later (as a failed one), so a sink that hangs for
	// everyone still leaves every grant confirmed. Default 5s.
	Patience time.Duration
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c *Config) init() {
	if c.Group == "" {
		c.Group = "settle"
	}
	if c.Consumer == "" {
		host, _ := os.Hostname()
		c.Consumer = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Batch <= 0 {
		c.Batch = 500
	}
	if c.Block == 0 {
		c.Block = time.Second
	}
	if c.ClaimAfter == 0 {
		c.ClaimAfter = 30 * time.Second
	}
	if c.Refresh == 0 {
		c.Refresh = 2 * time.Second
	}
	if c.MaxRetryDelay == 0 {
		c.MaxRetryDelay = 15 * time.Second
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.DeliverTimeout == 0 {
		c.DeliverTimeout = 2 * time.Minute
	}
	if c.Patience <= 0 {
		c.Patience = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats counts what a Worker did.
type Stats struct {
	Delivered int64 // grants confirmed and delivered
	Expired   int64 // grant entries whose grant had been released: not paid
	Anomalies int64 // grants of the outbox with no matching grant, release entries unreadable, paid grants whose confirm was lost (logged)
	// Failures counts what failed and is tried again: a read of a shard's
	// outboxes (the shard down, a stream whose consumer group was lost), a
	// confirm, a wait for a replica, a delivery, an acknowledgment. A stream that vanished
	// with its pool's close is no failure.
	Failures int64
	// Conflicts counts what left an entry pending for an operator, once
	// each: a grant whose serial the sink had paid for another grant, a
	// grant whose amount is not what its record holds, a grant paid and
	// then released (its shard lost the confirm: this worker remembers it
	// paid it, or the sink says so, ErrPaid), a grant to pay that the sink
	// recorded as settled unpaid (ErrSettledUnpaid), a damaged grant (no
	// positive serial or amount: each of an entry's counted), or an entry
	// that cannot be read as grants or a release (logged once each).
	Conflicts int64
	// LeftForOperator is how many entries left pending for an operator the
	// worker's last pass over each shard met (each pass reads the first
	// Config.Batch of an outbox's own pending entries again, and a page of
	// those behind them in turn), summed over the shards: not 0 while one
	// still waits for an operator among the first Batch of its outbox, and
	// so blocks its pool's close; 0 again once the operator has cleared
	// them. A pass that could not read a shard keeps that shard's figure.
	LeftForOperator int64
	// Lag is how far settlement is behind the grants: the age of the oldest
	// outbox entry (its stream id is the time it was written) that may be
	// unsettled, the largest over the shards; 0 when every shard's last pass
	// settled all it read and found no more. An entry whose delivery keeps
	// failing makes it grow until it is settled; one left for an operator
	// does not (Conflicts counts those). While a shard's outboxes cannot be
	// read, the lag grows from the start of the last pass that read them
	// all: nothing newer is known to be settled.
	Lag time.Duration
}

// Worker settles the outboxes of every shard.
type Worker struct {
	shards *shard.Set
	subs   SubPools
	sink   Sink
	cfg    Config
	// unpaid: the sink records the grants settled unpaid
	// (RecordsUnpaid), and is given them.
	unpaid bool

	delivered, expired, anomalies, failures, conflicts atomic.Int64
	behind                                             []atomic.Int64 // per shard (Run's order): unix ms of the oldest entry that may be unsettled; 0: none (see note)
	waiting                                            []atomic.Int64 // per shard: entries left for an operator its last pass met (see note)
	reading                                            []atomic.Int64 // per shard: unix ms of the oldest entry the pass under way is settling; 0: none (see settling)
	conflicted                                         sync.Map       // "stream id serial" of entries (and their grants) left pending for an operator
	awaitingOperator                                   sync.Map       // "stream id" of the entries left pending for an operator (settling)
	// marks holds what became of the grants this worker settled of
	// entries still pending to it (marks).
	marks marks

	// retries holds each entry whose confirm, delivery or acknowledgment
	// failed ("stream id"): it is tried again no sooner than its time, and
	// each failure doubles its wait (RetryDelay up to MaxRetryDelay). The
	// wait is the entry's own: a grant the sink keeps refusing, or whose
	// confirm keeps failing, never slows the other entries of its shard,
	// whose grants must be paid within their hold.
	retryMu sync.Mutex
	retries map[string]entryRetry
	sweptAt time.Time // when retries was last swept of entries no longer tried

	// detached waits for the batches a pass went on without
	// (Config.Patience; Run returns after them).
	detached sync.WaitGroup
}

// entryRetry is when an entry whose confirm, delivery or acknowledgment
// failed is tried again, and how long its next wait is; alone, that its
// grants go to the sink in calls of their own from then on (a call of
// several that ran out its DeliverTimeout held it: one grant the sink
// hangs on must not keep the others of its call unpaid).
type entryRetry struct {
	at    time.Time
	wait  time.Duration
	alone bool
}

// retryLater puts the entry off after a failed confirm, delivery or
// acknowledgment, doubling its wait; alone, its grants go to the sink in
// calls of their own from then on (entryRetry). A batch puts each of its
// entries off once at most (batch.retry).
func (w *Worker) retryLater(stream, id string, now time.Time, alone bool) {
	w.noteRetry(stream+" "+id, now, func(r *entryRetry, had bool) {
		if !had {
			r.wait = w.cfg.RetryDelay
		}
		r.at = now.Add(r.wait)
		r.wait = min(2*r.wait, max(w.cfg.MaxRetryDelay, w.cfg.RetryDelay))
		r.alone = r.alone || alone
	})
}

// noPlace puts the entry off for RetryDelay, its wait unchanged: its
// delivery found no place free among the shard's calls (deliverSlot),
// which is no failure of its own.
func (w *Worker) noPlace(stream, id string, now time.Time) {
	w.noteRetry(stream+" "+id, now, func(r *entryRetry, had bool) {
		if !had {
			r.wait = w.cfg.RetryDelay
		}
		r.at = now.Add(w.cfg.RetryDelay)
	})
}

// noteRetry updates the entry's retry (set says how; had, whether it had
// one), within the bound on retries.
func (w *Worker) noteRetry(key string, now time.Time, set func(r *entryRetry, had bool)) {
	w.retryMu.Lock()
	defer w.retryMu.Unlock()
	if w.retries == nil {
		w.retries = map[string]entryRetry{}
	}
	r, ok := w.retries[key]
	if !ok && len(w.retries) >= maxRetries {
		// Entries settled since (or taken over) are no longer tried; an
		// entry still failing is put off again at its next try. Swept at
		// most once a RetryDelay (a sweep is the whole map); while it is
		// still full a new failure is not put off: it is tried again on
		// the next pass, as every failure was before entries had waits of
		// their own.
		if now.Sub(w.sweptAt) < w.cfg.RetryDelay {
			return
		}
		w.sweptAt = now
		for k, r := range w.retries {
			if now.Sub(r.at) > w.cfg.MaxRetryDelay {
				delete(w.retries, k)
			}
		}
		if len(w.retries) >= maxRetries {
			return
		}
	}
	set(&r, ok)
	w.retries[key] = r
}

// alone reports whether the entry's grants go to the sink in calls of
// their own (entryRetry).
func (w *Worker) alone(stream, id string) bool {
	w.retryMu.Lock()
	defer w.retryMu.Unlock()
	return w.retries[stream+" "+id].alone
}

// putOff reports whether the entry's confirm, delivery or acknowledgment
// failed and its time to be tried again has not come.
func (w *Worker) putOff(stream, id string, now time.Time) bool {
	w.retryMu.Lock()
	defer w.retryMu.Unlock()
	r, ok := w.retries[stream+" "+id]
	return ok && now.Before(r.at)
}

// retried forgets the entries acknowledged.
func (w *Worker) retried(stream string, ids []string) {
	w.retryMu.Lock()
	defer w.retryMu.Unlock()
	for _, id := range ids {
		delete(w.retries, stream+" "+id)
	}
}

// maxRetries bounds retries before it is swept of entries no longer tried.
const maxRetries = 100_000

// New returns a worker; Run starts it.
func New(shards *shard.Set, subs SubPools, sink Sink, cfg Config) *Worker {
	cfg.init()
	n := len(shards.Names())
	ru, ok := sink.(RecordsUnpaid)
	return &Worker{shards: shards, subs: subs, sink: sink, cfg: cfg, unpaid: ok && ru.RecordsUnpaid(),
		behind: make([]atomic.Int64, n), reading: make([]atomic.Int64, n), waiting: make([]atomic.Int64, n)}
}

// Stats returns what the worker did so far.
func (w *Worker) Stats() Stats {
	var waiting int64
	for i := range w.waiting {
		waiting += w.waiting[i].Load()
	}
	return Stats{Delivered: w.delivered.Load(), Expired: w.expired.Load(),
		Anomalies: w.anomalies.Load(), Failures: w.failures.Load(), Conflicts: w.conflicts.Load(),
		LeftForOperator: waiting, Lag: w.lag(time.Now())}
}

// lag is Stats.Lag at now.
func (w *Worker) lag(now time.Time) time.Duration {
	var oldest int64
	for i := range w.behind {
		for _, at := range []int64{w.behind[i].Load(), w.reading[i].Load()} {
			if at != 0 && (oldest == 0 || at < oldest) {
				oldest = at
			}
		}
	}
	if oldest == 0 {
		return 0
	}
	return max(0, time.Duration(now.UnixMilli()-oldest)*time.Millisecond)
}

// pass is what one pass over a shard's outboxes left unsettled. Its
// streams' batches note in it at once.
type pass struct {
	mu         sync.Mutex      // guards the fields below
	oldest     int64           // unix ms of the oldest entry left unsettled; 0: none
	incomplete bool            // a read failed: the pass does not know
	vanished   bool            // a stream was gone (its pool closed): list them again
	left       map[string]bool // "stream id" of the entries left for an operator it met
	// failing holds the streams whose own read failed (a read of that
	// stream alone); shardFailed says a read of several failed.
	failing     map[string]bool
	shardFailed bool
}

// readFailed notes that a read of stream failed ("": of several).
func (p *pass) readFailed(stream string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stream == "" {
		p.shardFailed = true
		return
	}
	if p.failing == nil {
		p.failing = map[string]bool{}
	}
	p.failing[stream] = true
}

// leave notes an entry left for an operator.
func (p *pass) leave(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.left == nil {
		p.left = map[string]bool{}
	}
	p.left[key] = true
}

// behind notes that the entry id was left unsettled (or, for the last of
// a full batch, that entries no older may wait behind it).
func (p *pass) behind(id string) {
	ms, _, _ := strings.Cut(id, "-")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.oldest == 0 || at < p.oldest {
		p.oldest = at
	}
}

// behindAll notes every id.
func (p *pass) behindAll(ids []string) {
	for _, id := range ids {
		p.behind(id)
	}
}

// fail notes that a read failed (incomplete: entries it could not read
// may be unsettled), or that a stream vanished (list them again).
func (p *pass) fail(vanished, incomplete bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.incomplete = p.incomplete || incomplete
	p.vanished = p.vanished || vanished
}

// Run settles until ctx ends, one loop per shard. A shard that does not
// answer is tried again; nothing makes Run give up but ctx.
func (w *Worker) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i, name := range w.shards.Names() {
		sh := &shardLoop{i: i, name: name, c: w.shards.Client(name), cluster: w.shards.IsCluster(name),
			grouped: map[string]bool{}, calls: newPlaces(maxCalls), lonely: newPlaces(maxCalls / 2)}
		wg.Go(func() { w.loop(ctx, sh) })
	}
	wg.Wait()
	w.detached.Wait()
}

// shardLoop is what one shard's loop keeps between passes.
type shardLoop struct {
	i       int // the shard's place in Worker.behind
	name    string
	c       redis.UniversalClient
	cluster bool     // a Redis Cluster: its outboxes are in many slots, read one by one
	streams []string // the outboxes of the open pools' sub-pools here
	live    []string // those a pass reads: not put off (due)
	// paused holds the outboxes put off after failed reads of their own,
	// each read again at its time with its own backoff (pauseReads); claimed
	// when each was last looked at for entries to take over (claim). Only
	// the shard's loop uses them.
	paused  map[string]pause
	claimed map[string]time.Time
	// page holds, for an outbox whose own pending entries fill a read
	// (Config.Batch) and more, the id after which the next pass's second
	// read of them begins (nextPages).
	page map[string]string
	// claimFrom holds where the next round of claim goes on in an outbox
	// whose pending entries one round did not get through (maxClaimCalls).
	claimFrom map[string]string
	// marksChecked holds when forgetAcknowledged last looked up an
	// outbox's marked entries; unlistedChecked when refresh last looked up
	// those of the outboxes no longer listed.
	marksChecked    map[string]time.Time
	unlistedChecked time.Time
	grouped         map[string]bool // outboxes whose consumer group is known to be there
	settled         time.Time       // when the last pass that read every outbox began
	// calls holds a place for each call to the sink in flight for the
	// shard's grants (maxCalls), lonely one for each of a grant tried
	// alone (see deliverSlot).
	calls, lonely *places
	// slow counts the shard's batches still running that a pass went on
	// without (Config.Patience), for the log.
	slow atomic.Int64
	// running holds the entries ("stream id") of the batches a pass went
	// on without: 0 while the batch runs, then the pass it ended in
	// (passes), until the next pass begins. Passes skip them: a read made
	// before the batch acknowledged them may still hold them.
	running sync.Map
	passes  atomic.Int64 // the passes begun
}

// begin starts a pass over the shard: the entries of batches that ended
// during an earlier pass are no longer skipped (no read of this pass can
// hold them: they were acknowledged, or are pending again).
func (sh *shardLoop) begin() {
	n := sh.passes.Add(1)
	sh.running.Range(func(k, v any) bool {
		if ended := v.(int64); ended != 0 && ended < n {
			sh.running.Delete(k)
		}
		return true
	})
}

// loop settles one shard's outboxes until ctx ends.
func (w *Worker) loop(ctx context.Context, sh *shardLoop) {
	var nextRefresh, next time.Time
	backoff := w.cfg.RetryDelay
	sh.settled = time.Now()
	for ctx.Err() == nil {
		if w.cfg.Held != nil && w.cfg.Held(sh.name) {
			_ = wait.For(ctx, w.cfg.Refresh)
			continue
		}
		now := time.Now()
		if now.After(nextRefresh) {
			if err := w.refresh(ctx, sh); err != nil && ctx.Err() == nil {
				// A pool whose record cannot be read, or placed on a shard
				// this worker was not given: its outboxes are not read.
				w.failures.Add(1)
				w.cfg.Logger.Warn("settle: listing outboxes", "shard", sh.name, "err", err)
			}
			nextRefresh = now.Add(w.cfg.Refresh)
		}
		sh.live, next = sh.due(now)
		if len(sh.streams) > 0 && len(sh.live) == 0 {
			// Every outbox is put off after failed reads of its own: the
			// first to be read again sets the pass's time.
			_ = wait.For(ctx, min(next.Sub(now), w.cfg.Refresh))
			continue
		}
		if len(sh.streams) == 0 {
			w.behind[sh.i].Store(0)
			w.waiting[sh.i].Store(0)
			sh.settled = now
			_ = wait.For(ctx, w.cfg.Refresh)
			continue
		}
		// Own pending entries first (a failed delivery, or a restart under
		// the same consumer name), then those abandoned by others.
		sh.begin()
		var p pass
		if len(sh.live) < len(sh.streams) {
			p.fail(false, true) // outboxes put off: their entries may be unsettled
		}
		failed := w.read(ctx, sh, "0", &p)
		failed = w.claim(ctx, sh, &p, now) || failed
		failed = w.read(ctx, sh, ">", &p) || failed
		if p.vanished {
			nextRefresh = time.Time{}
		}
		if ctx.Err() == nil {
			w.note(sh, &p, now)
		}
		sh.pauseReads(&p, time.Now(), w.cfg)
		if !failed || !p.shardFailed {
			// Nothing failed, or only what waits a backoff of its own: an
			// outbox's read (pauseReads), an entry (Worker.retries), a
			// takeover (claim's own time).
			backoff = w.cfg.RetryDelay
			continue
		}
		_ = wait.For(ctx, backoff)
		backoff = min(2*backoff, max(w.cfg.MaxRetryDelay, w.cfg.RetryDelay))
	}
}

// note records what the pass that began at start left unsettled on the
// shard, for Stats.Lag. A pass that read every outbox knows the oldest
// entry it left; one that could not read some knows nothing newer than
// the last pass that could, so the oldest entry that may be unsettled
// there is no younger than that pass's start: the lag grows from it while
// the outboxes cannot be read, and a settlement that cannot progress
// shows in the metrics (and the alerts on them).
func (w *Worker) note(sh *shardLoop, p *pass, start time.Time) {
	defer w.reading[sh.i].Store(0) // what it read is settled, or noted in behind
	if left := int64(len(p.left)); !p.incomplete || left > w.waiting[sh.i].Load() {
		w.waiting[sh.i].Store(left) // an incomplete pass may have missed some: never lower
	}
	if !p.incomplete {
		w.behind[sh.i].Store(p.oldest)
		sh.settled = start
		return
	}
	at := sh.settled.UnixMilli()
	if p.oldest != 0 {
		at = min(at, p.oldest)
	}
	if prev := w.behind[sh.i].Load(); prev != 0 {
		at = min(at, prev)
	}
	w.behind[sh.i].Store(at)
}

// settling notes, while a pass settles msgs, the entries of stream, the
// oldest of them in reading: a pass that hangs (a delivery that does not
// return) shows in the lag at once, not when it ends. An entry left for an
// operator before is not counted: it is no lag (RainSettlementConflict
// says it waits), as a pass's end leaves it out too (pass.behind).
func (w *Worker) settling(sh *shardLoop, stream string, msgs []redis.XMessage) {
	for _, m := range msgs {
		if _, waits := w.awaitingOperator.Load(stream + " " + m.ID); waits {
			continue
		}
		ms, _, _ := strings.Cut(m.ID, "-")
		at, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			continue
		}
		for {
			cur := w.reading[sh.i].Load()
			if (cur != 0 && cur <= at) || w.reading[sh.i].CompareAndSwap(cur, at) {
				break
			}
		}
	}
}

// refresh lists the outbox keys of the open pools' sub-pools on the shard,
// creating the consumer group on each it meets the first time (lua.
// EnsureGroup, which creates nothing for a closed sub-pool). A pool whose
// life is over has none. When the listing fails the streams listed before
// are kept.
func (w *Worker) refresh(ctx context.Context, sh *shardLoop) error {
	subs, err := w.subs.SubPools(ctx)
	if subs == nil && err != nil {
		return err
	}
	var out []string
	live := map[string]bool{}
	for _, sp := range subs {
		if sp.Shard != sh.name {
			continue
		}
		k := sp.Keys()
		live[k.Outbox] = true
		if !sh.grouped[k.Outbox] {
			g, gerr := lua.EnsureGroup(ctx, sh.c, &k, w.cfg.Group)
			if gerr != nil {
				err = errors.Join(err, fmt.Errorf("consumer group on %s: %w", k.Outbox, gerr))
				continue
			}
			if g == lua.GroupGone {
				continue // closed: its keys are freed
			}
			sh.grouped[k.Outbox] = true
		}
		out = append(out, k.Outbox)
	}
	for key := range sh.grouped {
		if !live[key] {
			delete(sh.grouped, key)
		}
	}
	sh.forget(live)
	sh.streams = out
	// The marks of an outbox no longer listed (its pool closed, or its
	// record unreadable for now) leave once its entries are gone: up to
	// maxMarkChecks entries a listing, no more than once a markCheckEvery.
	if now := time.Now(); now.Sub(sh.unlistedChecked) >= markCheckEvery {
		sh.unlistedChecked = now
		w.forgetGoneEntries(ctx, sh, w.marks.unlisted(sh.name, live, maxMarkChecks))
	}
	return err
}

// read reads entries from the shard's outboxes at id (">" new, "0" own
// pending) and settles each stream's as a batch, the streams at once,
// noting in p what it left unsettled. It reports whether an entry was left
// for a failure.
//
// One read covers every outbox of the shard; Redis answers an error for
// the whole read when one stream has lost its group (its pool closed and
// its keys were freed, or the shard lost its data). Then each outbox is read
// on its own, so that one stream never stops the others: a stream whose
// group is gone is dropped (its pool closed) or has its group made again.
func (w *Worker) read(ctx context.Context, sh *shardLoop, id string, p *pass) (failed bool) {
	block := time.Duration(-1) // no BLOCK: pending entries are there or not
	if id == ">" {
		block = w.cfg.Block
	}
	streams := sh.live
	if len(streams) == 0 {
		return false // every outbox put off, or gone with its pool
	}
	if sh.cluster {
		return w.readEach(ctx, sh, streams, id, block, p)
	}
	res, err := w.xread(ctx, sh, streams, id, block)
	var rerr redis.Error
	if err != nil && !errors.Is(err, redis.Nil) && errors.As(err, &rerr) && len(streams) > 1 {
		// (redis.Nil is a redis.Error too: a read that found nothing new.)
		res, failed = nil, false
		for _, key := range slices.Clone(streams) { // readFailed may drop one
			one, oerr := w.xread(ctx, sh, []string{key}, id, -1)
			if errors.Is(oerr, redis.Nil) {
				continue // nothing new there
			}
			if oerr != nil {
				failed = w.readFailed(ctx, sh, key, oerr, p, true) || failed
				continue
			}
			res = append(res, one...)
		}
		err = nil
	}
	if id == "0" && err == nil {
		res = w.nextPages(ctx, sh, res, p)
	}
	switch {
	case errors.Is(err, redis.Nil), ctx.Err() != nil:
		return false
	case err != nil:
		key := ""
		if len(streams) == 1 {
			key = streams[0]
		}
		return w.readFailed(ctx, sh, key, err, p, true)
	}
	for _, st := range res {
		w.settling(sh, st.Stream, st.Messages)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, st := range res {
		wg.Go(func() {
			f := w.settleOrGoOn(ctx, sh, st.Stream, st.Messages, p)
			mu.Lock()
			failed = failed || f
			mu.Unlock()
		})
		if id == ">" && int64(len(st.Messages)) >= w.cfg.Batch {
			p.behind(st.Messages[len(st.Messages)-1].ID) // more may wait
		}
	}
	wg.Wait()
	return failed
}

// readEach is read on a cluster shard: one XREADGROUP may not span slots,
// so each outbox is read on its own (not blocking), its entries settled as
// a batch; when none had anything new the pass waits block (a blocking read
// of one stream would hold up the others).
func (w *Worker) readEach(ctx context.Context, sh *shardLoop, streams []string, id string, block time.Duration, p *pass) (failed bool) {
	read := 0
	for _, key := range slices.Clone(streams) { // readFailed may drop one
		res, err := w.xread(ctx, sh, []string{key}, id, -1)
		if id == "0" && err == nil {
			res = w.nextPages(ctx, sh, res, p)
		}
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			failed = w.readFailed(ctx, sh, key, err, p, true) || failed
			continue
		}
		for _, st := range res {
			read += len(st.Messages)
			w.settling(sh, st.Stream, st.Messages)
			failed = w.settleOrGoOn(ctx, sh, st.Stream, st.Messages, p) || failed
			if id == ">" && int64(len(st.Messages)) >= w.cfg.Batch {
				p.behind(st.Messages[len(st.Messages)-1].ID) // more may wait
			}
		}
	}
	if read == 0 && block > 0 && ctx.Err() == nil {
		_ = wait.For(ctx, block)
	}
	return failed
}

// xread is one XREADGROUP of streams at id (">" new entries; "0", or
// the id after which to begin, the worker's own pending ones).
func (w *Worker) xread(ctx context.Context, sh *shardLoop, streams []string, id string, block time.Duration) ([]redis.XStream, error) {
	ids := make([]string, len(streams))
	for i := range ids {
		ids[i] = id
	}
	return w.xreadAt(ctx, sh, streams, ids, block)
}

// xreadAt is one XREADGROUP of streams, each at its id in ids.
func (w *Worker) xreadAt(ctx context.Context, sh *shardLoop, streams, ids []string, block time.Duration) ([]redis.XStream, error) {
	args := make([]string, 0, 2*len(streams))
	args = append(args, streams...)
	args = append(args, ids...)
	return sh.c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: w.cfg.Group, Consumer: w.cfg.Consumer, Streams: args, Count: w.cfg.Batch, Block: block,
	}).Result()
}

// readFailed handles a read (or claim) that failed; key is the one stream
// it was of ("" for several). A stream whose group is gone (NOGROUP) is
// looked at: a closed sub-pool's is dropped from the shard's streams, and
// that is no failure; any other failure counts (Stats.Failures), leaves the
// pass incomplete, and is tried again after the backoff. It reports whether
// the read failed.
func (w *Worker) readFailed(ctx context.Context, sh *shardLoop, key string, err error, p *pass, reading bool) bool {
	if ctx.Err() != nil {
		return false
	}
	if key != "" && redis.HasErrorPrefix(err, "NOGROUP") {
		delete(sh.grouped, key)
		if w.gone(ctx, sh, key) {
			sh.drop(key)
			w.marks.dropOutbox(outboxOf{sh.name, key})
			p.fail(true, false)
			return false
		}
	}
	w.failures.Add(1)
	p.fail(redis.HasErrorPrefix(err, "NOGROUP"), true)
	if reading {
		p.readFailed(key) // put off: the stream's (pauseReads), or the shard's
	}
	w.cfg.Logger.Warn("settle: read", "shard", sh.name, "stream", key, "err", err)
	return true
}

// gone reports whether the outbox key belongs to a sub-pool that is closed
// (or was never set up), making its group again otherwise.
func (w *Worker) gone(ctx context.Context, sh *shardLoop, key string) bool {
	sp, ok := rain.ParseOutbox(key)
	if !ok {
		return false
	}
	k := sp.Keys()
	g, err := lua.EnsureGroup(ctx, sh.c, &k, w.cfg.Group)
	if err == nil && g != lua.GroupGone {
		sh.grouped[key] = true
	}
	return err == nil && g == lua.GroupGone
}

// maxClaimCalls bounds the XAUTOCLAIM calls of one outbox in one round
// of claim; the next round goes on where it stopped.
const maxClaimCalls = 8

// claim takes over entries pending on other consumers for ClaimAfter, on
// each outbox the pass reads that it has not looked at within the last
// min(ClaimAfter/2, 5s). It reports whether an entry was left for a
// failure.
func (w *Worker) claim(ctx context.Context, sh *shardLoop, p *pass, now time.Time) (failed bool) {
	every := min(w.cfg.ClaimAfter/2, 5*time.Second)
	for _, key := range slices.Clone(sh.live) { // readFailed may drop one
		if at, ok := sh.claimed[key]; ok && now.Sub(at) < every {
			continue
		}
		if sh.claimed == nil {
			sh.claimed = map[string]time.Time{}
		}
		sh.claimed[key] = now
		start, ok := sh.claimFrom[key]
		if !ok {
			start = "0-0"
		}
		for calls := 1; ; calls++ {
			msgs, next, err := sh.c.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: key, Group: w.cfg.Group, Consumer: w.cfg.Consumer,
				MinIdle: w.cfg.ClaimAfter, Start: start, Count: w.cfg.Batch,
			}).Result()
			if err != nil {
				failed = w.readFailed(ctx, sh, key, err, p, false) || failed
				break
			}
			if len(msgs) > 0 {
				w.settling(sh, key, msgs)
				failed = w.settleOrGoOn(ctx, sh, key, msgs, p) || failed
			}
			// Redis looks at ten times Count pending entries a call at
			// most: an empty answer is not the end, next is.
			if next == "0-0" {
				delete(sh.claimFrom, key)
				break
			}
			if calls == maxClaimCalls {
				if sh.claimFrom == nil {
					sh.claimFrom = map[string]string{}
				}
				sh.claimFrom[key] = next // the next round goes on from there
				break
			}
			start = next
		}
	}
	return failed
}

// pause is an outbox put off after a failed read of its own: read again
// from until; delay is the wait of its last failure, doubled at its next.
type pause struct {
	until time.Time
	delay time.Duration
}

// due returns the outboxes a pass at now reads (those not put off, in
// order), and the earliest time one put off is read again.
func (sh *shardLoop) due(now time.Time) (live []string, next time.Time) {
	live = make([]string, 0, len(sh.streams))
	for _, s := range sh.streams {
		pa, paused := sh.paused[s]
		if !paused || !now.Before(pa.until) {
			live = append(live, s)
		} else if next.IsZero() || pa.until.Before(next) {
			next = pa.until
		}
	}
	return live, next
}

// drop forgets an outbox gone with its pool.
func (sh *shardLoop) drop(key string) {
	del := func(s string) bool { return s == key }
	sh.streams = slices.DeleteFunc(sh.streams, del)
	sh.live = slices.DeleteFunc(sh.live, del)
	delete(sh.paused, key)
	delete(sh.claimed, key)
	delete(sh.page, key)
	delete(sh.claimFrom, key)
	delete(sh.marksChecked, key)
}

// nextPages adds to res, a read of streams' own pending entries from
// their start, one more page of each stream whose read was full
// (Config.Batch): the page after the one the last pass read there, or
// after this read's (shardLoop.page). So every pass reads the front of
// each outbox's pending entries (those put off the longest fall due
// first), and entries put off there never hide those behind them: the
// passes read those a page each in turn. A read that fails leaves them to
// the next pass.
func (w *Worker) nextPages(ctx context.Context, sh *shardLoop, res []redis.XStream, p *pass) []redis.XStream {
	w.forgetAcknowledged(ctx, sh, res)
	var more, from []string
	for _, st := range res {
		if int64(len(st.Messages)) < w.cfg.Batch {
			delete(sh.page, st.Stream)
			continue
		}
		last := st.Messages[len(st.Messages)-1].ID
		at, ok := sh.page[st.Stream]
		if !ok || !idAfter(at, last) {
			at = last // the front reaches past the page the last pass read
		} else {
			// The entries between the front and the page read next are
			// not read in this pass: they may be unsettled, and no
			// younger than the front's last.
			w.maybeBehind(p, st.Stream, last)
		}
		more, from = append(more, st.Stream), append(from, at)
	}
	if len(more) == 0 {
		return res
	}
	next, err := w.xreadAt(ctx, sh, more, from, -1)
	if err != nil && !errors.Is(err, redis.Nil) {
		if ctx.Err() == nil {
			w.failures.Add(1)
			p.fail(false, true)
			w.cfg.Logger.Warn("settle: read of the next page of pending entries", "shard", sh.name, "err", err)
		}
		return res
	}
	got := map[string][]redis.XMessage{}
	for _, st := range next {
		got[st.Stream] = st.Messages
	}
	for i := range res {
		s := res[i].Stream
		if !slices.Contains(more, s) {
			continue
		}
		page := got[s]
		if int64(len(page)) < w.cfg.Batch {
			delete(sh.page, s) // the end: the next pass reads on after the front
		} else {
			w.maybeBehind(p, s, page[len(page)-1].ID) // more may wait behind it
			if sh.page == nil {
				sh.page = map[string]string{}
			}
			sh.page[s] = page[len(page)-1].ID
		}
		res[i].Messages = append(res[i].Messages, page...)
	}
	return res
}

// forgetAcknowledged forgets what Worker.marks holds of entries gone from
// their outbox (forgetGoneEntries), for the outboxes of res (a read of this
// worker's own pending entries: all the shard's, or on a Redis Cluster one
// outbox) with marks, each looked at no more than once a markCheckEvery;
// the entries res holds are there.
func (w *Worker) forgetAcknowledged(ctx context.Context, sh *shardLoop, res []redis.XStream) {
	now := time.Now()
	var looks []markLookup
	left := maxMarkChecks
	for _, st := range res {
		if at, ok := sh.marksChecked[st.Stream]; ok && now.Sub(at) < markCheckEvery || left == 0 {
			continue
		}
		read := make(map[string]bool, len(st.Messages))
		for _, m := range st.Messages {
			read[m.ID] = true
		}
		ids := w.marks.entries(outboxOf{sh.name, st.Stream}, read, left)
		if len(ids) == 0 {
			continue
		}
		if sh.marksChecked == nil {
			sh.marksChecked = map[string]time.Time{}
		}
		sh.marksChecked[st.Stream] = now
		looks, left = append(looks, markLookup{st.Stream, ids}), left-len(ids)
	}
	w.forgetGoneEntries(ctx, sh, looks)
}

// markLookup is marked entries of one outbox to look up (forgetGoneEntries).
type markLookup struct {
	stream string
	ids    []string
}

// forgetGoneEntries forgets what Worker.marks holds of the entries of looks
// gone from their outbox: each is looked up (XRANGE of the id alone), all
// in one pipeline, and those not there are forgotten. An entry is gone only
// once acknowledged and deleted (acknowledge.lua, or an operator), and ids
// are never used again, so no mark of an entry that can still be paid is
// lost; an entry another worker took over keeps its marks, for it may come
// back. A pipeline that fails forgets nothing.
func (w *Worker) forgetGoneEntries(ctx context.Context, sh *shardLoop, looks []markLookup) {
	if len(looks) == 0 {
		return
	}
	pipe := sh.c.Pipeline()
	cmds := make([][]*redis.XMessageSliceCmd, len(looks))
	for i, l := range looks {
		for _, id := range l.ids {
			cmds[i] = append(cmds[i], pipe.XRangeN(ctx, l.stream, id, id, 1))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return
	}
	for i, l := range looks {
		var gone []string
		for j, cmd := range cmds[i] {
			if len(cmd.Val()) == 0 {
				gone = append(gone, l.ids[j])
			}
		}
		w.marks.drop(outboxOf{sh.name, l.stream}, gone)
	}
}

// markCheckEvery is how often forgetAcknowledged looks up one outbox's
// marked entries at most, and refresh those of the outboxes no longer
// listed.
const markCheckEvery = time.Second

// maybeBehind notes in p that entries of stream no younger than id may be
// unsettled, unless id waits for an operator: an outbox whose pending
// entries all do is no lag (Stats.Lag), and one of those is no mark of
// what lies behind it.
func (w *Worker) maybeBehind(p *pass, stream, id string) {
	if _, waits := w.awaitingOperator.Load(stream + " " + id); !waits {
		p.behind(id)
	}
}

// idAfter reports whether stream id a comes after b ("ms-seq").
func idAfter(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ami, _ := strconv.ParseUint(am, 10, 64)
	bmi, _ := strconv.ParseUint(bm, 10, 64)
	if ami != bmi {
		return ami > bmi
	}
	asi, _ := strconv.ParseUint(as, 10, 64)
	bsi, _ := strconv.ParseUint(bs, 10, 64)
	return asi > bsi
}

// pauseReads puts off each outbox whose own read failed in p, by twice its
// last wait (RetryDelay the first time, up to MaxRetryDelay); every other
// outbox the pass read, in a pass without a failed read of several, is
// no longer put off.
func (sh *shardLoop) pauseReads(p *pass, now time.Time, cfg Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.failing {
		d := cfg.RetryDelay
		if pa, ok := sh.paused[s]; ok {
			d = min(2*pa.delay, max(cfg.MaxRetryDelay, cfg.RetryDelay))
		}
		if sh.paused == nil {
			sh.paused = map[string]pause{}
		}
		sh.paused[s] = pause{until: now.Add(d), delay: d}
	}
	if !p.shardFailed {
		for _, s := range sh.live {
			if !p.failing[s] {
				delete(sh.paused, s)
			}
		}
	}
}

// forget forgets what the loop keeps of outboxes no longer listed.
func (sh *shardLoop) forget(live map[string]bool) {
	forgetGone(sh.paused, live)
	forgetGone(sh.claimed, live)
	forgetGone(sh.page, live)
	forgetGone(sh.claimFrom, live)
	forgetGone(sh.marksChecked, live)
}

// forgetGone deletes from m the outboxes not in live.
func forgetGone[V any](m map[string]V, live map[string]bool) {
	maps.DeleteFunc(m, func(s string, _ V) bool { return !live[s] })
}
