package settle

// This file is one batch of outbox entries settled: the grants confirmed in
// one script per Config.Batch of them (and, on a shard with replicas, on a
// replica before anything is paid), delivered in one call to the sink per
// script, and every entry settled acknowledged and trimmed from the stream
// in one script.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
	"rain/internal/shard"
)

// batch is one stream's entries of a read, as settleBatch sorts them.
type batch struct {
	shard  string // the name of the outbox's shard
	stream string
	sp     rain.SubPool // the stream's sub-pool, when spOK (rain.ParseOutbox)
	spOK   bool
	done   []string // ids of the entries settled, to acknowledge and trim
	grants []Grant  // the grants of the grant entries, to confirm and deliver
	ids    []string // the id of each grant's entry
	// several holds each entry of several grants (an entry of a batch's
	// grants, lua.ParseOutboxEntries): how many of its grants are not
	// settled yet (the entry is settled with the last of them).
	several map[string]*span
	// retry holds the entries a failure leaves pending (id -> alone:
	// its grants go to the sink in calls of their own from then on), put
	// off once each when the batch ends (Worker.retryLater): a failure of
	// several of its grants, or of several steps, doubles its wait once.
	retry map[string]bool
	// noted holds the grants alone in their entries that this batch
	// settled (their places in grants, and how): they are marked
	// (Worker.marks) only when their entries' acknowledgment fails
	// (acknowledge).
	noted []notedGrant
}

// notedGrant is a grant alone in its entry that a batch settled: its place
// in batch.grants, and how.
type notedGrant struct {
	i int
	o outcome
}

// mark marks b.grants[i] with o (Worker.marks): at once for a grant of an
// entry of several, once an acknowledgment fails for a grant alone in its
// entry (batch.noted).
func (w *Worker) mark(b *batch, i int, o outcome) {
	if _, several := b.several[b.ids[i]]; several {
		w.marks.set(b.outbox(), b.ids[i], b.grants[i].Serial, o)
		return
	}
	b.noted = append(b.noted, notedGrant{i, o})
}

// outbox names b's outbox in Worker.marks.
func (b *batch) outbox() outboxOf { return outboxOf{b.shard, b.stream} }

// retryLater notes that entry id is tried again later (batch.retry).
func (b *batch) retryLater(id string, alone bool) {
	if b.retry == nil {
		b.retry = map[string]bool{}
	}
	b.retry[id] = b.retry[id] || alone
}

// span is how many of an entry's grants are not settled yet.
type span struct{ open int }

// seenBefore is what this worker remembers of b.grants[i] (Worker.marks).
func (w *Worker) seenBefore(b *batch, i int) outcome {
	return w.marks.get(b.outbox(), b.ids[i], b.grants[i].Serial)
}

// settled notes that b.grants[i] is settled; its entry is, with the last
// of its grants.
func (b *batch) settled(i int) {
	id := b.ids[i]
	if sp, several := b.several[id]; several {
		if sp.open--; sp.open > 0 {
			return
		}
	}
	b.done = append(b.done, id)
}

// settleBatch settles msgs, the entries of one outbox (one sub-pool): its
// grants in confirm scripts and deliveries of at most Config.Batch grants
// each (every part confirmed before any is delivered), then one
// acknowledgment. An entry it cannot read is acknowledged only when it is a
// release (which pays nothing); any other is left pending for an operator. A
// grant whose confirm or delivery fails leaves its entry pending, tried
// again after a wait of its own (Worker.retries), and so does one whose
// serial the sink paid for another grant, or settled the other way (ErrPaid,
// ErrSettledUnpaid: left for an operator). Every other entry is acknowledged
// and deleted from the stream, so that an outbox holds what is unsettled,
// not everything ever granted. It reports whether an entry was left pending
// for a failure of a confirm or an acknowledgment (for the count; such an
// entry, as one whose delivery failed, waits a backoff of its own and slows
// no other).
//
// An entry of several grants is acknowledged once every one of them is
// settled. Until then each pass confirms all of them again (confirm is
// idempotent, and heals a confirm a shard lost) and delivers again only
// those this worker has not paid (Worker.marks), so that one grant left for
// an operator never keeps the others of its entry from being retried and
// paid, and nothing is counted twice. A grant this worker paid that is no
// longer confirmed (its shard lost the confirm) is left for an operator; a
// worker that did not pay it (restarted, or taking the entry over) does not
// know, and asks the sink when it records unpaid grants (it settles the
// grant unpaid there, and the sink refuses one it paid: payCall); with
// another sink it takes the grant for released unpaid. A read of such
// entries may take several parts: after each, the entries settled are
// acknowledged and the rest of the read is claimed again (keep), so that no
// other worker takes over what this one is still working through.
func (w *Worker) settleBatch(ctx context.Context, sh *shardLoop, stream string, msgs []redis.XMessage, p *pass) (failed bool) {
	b := batch{shard: sh.name, stream: stream}
	defer func() {
		now := time.Now()
		for id, alone := range b.retry {
			w.retryLater(stream, id, now, alone)
		}
	}()
	b.sp, b.spOK = rain.ParseOutbox(stream)
	now := time.Now()
	for _, m := range msgs {
		if w.putOff(stream, m.ID, now) {
			p.behind(m.ID) // it failed lately: tried again at its time
			if _, waits := w.awaitingOperator.Load(stream + " " + m.ID); waits {
				p.leave(stream + " " + m.ID) // still left for an operator meanwhile
			}
			continue
		}
		gs, release, err := b.parseGrants(m)
		switch {
		case err != nil && release:
			w.anomalies.Add(1)
			w.cfg.Logger.Error("settle: unreadable release entry; acknowledged", "stream", stream, "id", m.ID, "err", err)
			b.done = append(b.done, m.ID) // a release pays nothing
		case err != nil:
			// Perhaps a grant, or a form a later rain writes: acknowledged,
			// it would never be paid, and its grant would be released at its
			// deadline. Left pending for an operator, as a mismatch is.
			w.leftForOperator(p, stream, m.ID, "", fmt.Errorf("unreadable outbox entry: %w", err))
		case release:
			b.done = append(b.done, m.ID) // not paid
		default:
			if len(gs) > 1 {
				if b.several == nil {
					b.several = map[string]*span{}
				}
				b.several[m.ID] = &span{open: len(gs)}
			}
			for i, g := range gs {
				if g.Serial <= 0 || g.AmountCents <= 0 {
					// No grant has either: a damaged grant, left for an
					// operator. Its entry stays pending (it is never
					// settled), and the entry's other grants are settled.
					// Named by its place too: two damaged grants of an
					// entry may share a serial (0), and each is counted.
					w.leftForOperator(p, stream, m.ID, fmt.Sprintf("%d (grant %d of the entry)", g.Serial, i+1),
						fmt.Errorf("outbox grant %s serial %d: want a positive serial and amount", g, g.Serial))
					continue
				}
				b.grants, b.ids = append(b.grants, g), append(b.ids, m.ID)
			}
		}
	}
	// A read of Config.Batch entries of a batch's grants each holds up to
	// that many times more grants: confirmed and delivered in parts no
	// larger than a read of entries of one grant each (a confirm's HMGET of
	// tens of thousands of users would fail in Lua, every pass).
	// Every part is confirmed before any is delivered: a delivery that
	// hangs must not keep the grants of the parts after it unconfirmed
	// past their hold.
	type part struct {
		to    int
		pay   []Grant
		payAt []int
		at    time.Time // when it was confirmed
	}
	var parts []part
	size := int(w.cfg.Batch)
	for from := 0; from < len(b.grants) && ctx.Err() == nil; from += size {
		to := min(from+size, len(b.grants))
		pay, payAt, f := w.confirmGrants(ctx, sh, &b, from, to, p)
		failed = failed || f
		parts = append(parts, part{to: to, pay: pay, payAt: payAt, at: time.Now()})
	}
	if len(parts) > 1 {
		w.keep(ctx, sh, &b, 0) // the confirms of many parts may have taken a while
	}
	for _, pt := range parts {
		if ctx.Err() != nil {
			break
		}
		if time.Since(pt.at) > time.Second {
			// Confirmed a while ago (the parts before it took their time):
			// paid only if still confirmed, as it was when each part was
			// confirmed just before its delivery.
			pt.pay, pt.payAt = w.stillConfirmed(ctx, sh, &b, p, pt.pay, pt.payAt)
		}
		w.payGrants(ctx, sh, &b, p, pt.pay, pt.payAt)
		if pt.to < len(b.grants) {
			if w.acknowledge(ctx, sh, &b, p) {
				failed = true
			}
			w.keep(ctx, sh, &b, pt.to)
		}
	}
	if w.acknowledge(ctx, sh, &b, p) {
		failed = true
	}
	return failed
}

// acknowledge acknowledges and trims the entries of b settled so far, and
// forgets what Worker.marks holds of them. It reports a failure (the
// entries are then settled again, at no cost, on the next pass: the
// grants alone in their entries that the batch settled are marked, as
// those of entries of several grants are as they are settled, so that
// they are neither paid nor counted again).
func (w *Worker) acknowledge(ctx context.Context, sh *shardLoop, b *batch, p *pass) (failed bool) {
	if len(b.done) == 0 {
		return false
	}
	done, noted := b.done, b.noted
	b.done, b.noted = nil, nil
	if err := lua.Acknowledge(ctx, sh.c, b.stream, w.cfg.Group, done); err != nil {
		if ctx.Err() == nil {
			w.failures.Add(int64(len(done)))
			w.cfg.Logger.Warn("settle: acknowledge; entries left pending", "stream", b.stream, "entries", len(done), "err", err)
			p.behindAll(done)
			for _, id := range done {
				b.retryLater(id, false)
			}
			for _, g := range noted {
				w.marks.set(b.outbox(), b.ids[g.i], b.grants[g.i].Serial, g.o)
			}
			return true
		}
		return false
	}
	w.retried(b.stream, done)
	w.marks.drop(b.outbox(), done)
	return false
}

// keep claims again for this worker (XCLAIM JUSTID: their idle time back
// to 0) the entries of b with grants from the from'th on that have been
// idle a quarter of Config.ClaimAfter, so that they do not look abandoned
// while the parts before them take their time; one another worker took
// over within that quarter (after a part of this worker's longer than
// about three quarters of ClaimAfter) stays where it is. A failure, or
// parts that long, only let two workers deliver some grants each, which
// pays nothing twice: the sinks dedupe.
func (w *Worker) keep(ctx context.Context, sh *shardLoop, b *batch, from int) {
	var ids []string
	for i := from; i < len(b.ids); i++ {
		if len(ids) == 0 || ids[len(ids)-1] != b.ids[i] {
			ids = append(ids, b.ids[i])
		}
	}
	err := sh.c.XClaimJustID(ctx, &redis.XClaimArgs{Stream: b.stream, Group: w.cfg.Group, Consumer: w.cfg.Consumer,
		MinIdle: w.cfg.ClaimAfter / 4, Messages: ids}).Err()
	if err != nil && ctx.Err() == nil {
		w.cfg.Logger.Warn("settle: claim again the rest of a read", "stream", b.stream, "entries", len(ids), "err", err)
	}
}

// confirmGrants confirms b's grants from to to (exclusive), notes what is
// settled without a payout (batch.settled: released, unmatched), and
// returns the grants to pay and their places in b.grants (payGrants). When
// the sink records unpaid grants (Worker.unpaid), those it would settle
// unpaid are returned with them instead (Grant.Unpaid), unless this worker
// settled them so before: they are settled once the sink has them, and a
// grant the sink paid is then left for an operator (payCall). It reports
// whether some are left pending for a failure.
func (w *Worker) confirmGrants(ctx context.Context, sh *shardLoop, b *batch, from, to int, p *pass) (pay []Grant, payAt []int, failed bool) {
	res, errs, err := w.confirmOf(ctx, sh, b, b.grants[from:to])
	if err != nil {
		if ctx.Err() == nil {
			w.failures.Add(int64(to - from))
			w.cfg.Logger.Warn("settle: confirm; entries left pending", "stream", b.stream, "grants", to-from, "err", err)
			for _, id := range b.ids[from:to] {
				b.retryLater(id, false)
			}
		}
		p.behindAll(b.ids[from:to])
		return nil, nil, true
	}
	for j, g := range b.grants[from:to] {
		i := from + j
		before := w.seenBefore(b, i)
		switch {
		case errs[j] != nil:
			w.failures.Add(1)
			w.cfg.Logger.Error("settle: confirm of one grant failed; entry left pending", "stream", b.stream, "id", b.ids[i], "serial", g.Serial, "err", errs[j])
			p.behind(b.ids[i])
			b.retryLater(b.ids[i], false)
			failed = true
		case before == paidOut && res[j].Result == lua.AlreadyConfirmed:
			b.settled(i) // paid on an earlier pass, its entry still pending
			w.mark(b, i, paidOut)
		case res[j].Result == lua.Confirmed || res[j].Result == lua.AlreadyConfirmed:
			if before == paidOut {
				// Confirmed again: its shard had lost the confirm made before
				// the payout. Delivered again (the sink dedupes).
				w.anomalies.Add(1)
				w.cfg.Logger.Error("settle: a paid grant's confirm was lost and is made again", "stream", b.stream, "id", b.ids[i], "serial", g.Serial)
			}
			pay, payAt = append(pay, g), append(payAt, i)
		case before == paidOut:
			// Paid, and no longer confirmed: released at its deadline (and
			// perhaps its user granted again under another serial), so its
			// shard lost the confirm, and the amount is back in the stock.
			// Left for an operator.
			w.leftForOperator(p, b.stream, b.ids[i], strconv.FormatInt(g.Serial, 10),
				fmt.Errorf("%s serial %d was paid and is no longer confirmed (%v): its shard lost the confirm, and its amount is back in the stock", g, g.Serial, res[j].Result))
		case res[j].Result == lua.WasReleased && before != expiredOut && w.unpaid:
			g.Unpaid = Released // settled once the sink records it (payCall)
			pay, payAt = append(pay, g), append(payAt, i)
		case res[j].Result == lua.WasReleased:
			if before != expiredOut {
				w.expired.Add(1) // released at its deadline first: not paid
			}
			w.mark(b, i, expiredOut)
			b.settled(i)
		case res[j].Result == lua.AmountMismatch:
			// The entry would pay another amount than the grant holds:
			// nothing is confirmed or paid; left pending for an operator
			// (the pool cannot close until one looks).
			w.leftForOperator(p, b.stream, b.ids[i], strconv.FormatInt(g.Serial, 10), fmt.Errorf("outbox entry of %s serial %d pays %d cents; the grant holds %d",
				g, g.Serial, g.AmountCents, res[j].Amount))
		case before != unmatched && w.unpaid:
			g.Unpaid = Unmatched // settled once the sink records it (payCall)
			pay, payAt = append(pay, g), append(payAt, i)
		default:
			if before != unmatched {
				w.unmatchedGrant(g)
			}
			w.mark(b, i, unmatched)
			b.settled(i)
		}
	}
	return pay, payAt, failed
}

// unmatchedGrant counts and logs a grant of an outbox that matches no
// grant of its shard, settled unpaid.
func (w *Worker) unmatchedGrant(g Grant) {
	w.anomalies.Add(1)
	w.cfg.Logger.Error("settle: outbox grant has no matching grant; settled unpaid",
		"pool_id", g.PoolID, "user_id", g.UserID, "serial", g.Serial)
}

// confirmOf confirms gs, grants of b (of its stream's sub-pool, or, for a
// stream that is none's, of the first grant's), in one script (confirm).
func (w *Worker) confirmOf(ctx context.Context, sh *shardLoop, b *batch, gs []Grant) ([]lua.ConfirmResult, []error, error) {
	sp := b.sp
	if !b.spOK {
		sp = rain.SubPool{Pool: gs[0].PoolID, Index: gs[0].SubPool}
	}
	k := sp.Keys()
	args := make([]lua.ConfirmArg, len(gs))
	for j, g := range gs {
		args[j] = lua.ConfirmArg{User: g.UserID, Serial: g.Serial, Amount: g.AmountCents}
	}
	return w.confirm(ctx, sh, &k, args)
}

// stillConfirmed confirms again (the script is idempotent) the grants of
// pay, confirmed a while ago, and returns those that still are: a shard
// that lost its confirms since (a host crash under --durability relaxed)
// may have released one, its amount back in the stock. The others are not
// paid now, and their entries stay pending: the next pass settles them
// from what the shard then holds, and one whose confirm failed now waits
// a retry of its own first, its failure counted, as a first confirm's is.
func (w *Worker) stillConfirmed(ctx context.Context, sh *shardLoop, b *batch, p *pass, pay []Grant, payAt []int) ([]Grant, []int) {
	if len(pay) == 0 {
		return nil, nil
	}
	// A grant to settle unpaid (Grant.Unpaid) is not confirmed: it is
	// settled as it was found.
	var keep, confirmed []Grant
	var keepAt, confirmedAt []int
	for j, g := range pay {
		if g.Unpaid != "" {
			keep, keepAt = append(keep, g), append(keepAt, payAt[j])
		} else {
			confirmed, confirmedAt = append(confirmed, g), append(confirmedAt, payAt[j])
		}
	}
	if len(confirmed) == 0 {
		return keep, keepAt
	}
	res, errs, err := w.confirmOf(ctx, sh, b, confirmed)
	dropped := 0
	for j, g := range confirmed {
		id := b.ids[confirmedAt[j]]
		switch {
		case err == nil && errs[j] == nil && (res[j].Result == lua.Confirmed || res[j].Result == lua.AlreadyConfirmed):
			keep, keepAt = append(keep, g), append(keepAt, confirmedAt[j])
			continue
		case (err != nil || errs[j] != nil) && ctx.Err() == nil:
			w.failures.Add(1)
			b.retryLater(id, false)
		}
		dropped++
		p.behind(id)
	}
	if dropped > 0 && ctx.Err() == nil {
		w.cfg.Logger.Warn("settle: grants confirmed earlier in a read are not paid now: no longer confirmed, or the confirm again failed",
			"stream", b.stream, "grants", dropped, "err", err)
	}
	return keep, keepAt
}

// payGrants delivers pay, grants of b confirmed, or to settle unpaid
// (Grant.Unpaid; payAt: their places in b.grants), and notes what is
// settled.
func (w *Worker) payGrants(ctx context.Context, sh *shardLoop, b *batch, p *pass, pay []Grant, payAt []int) {
	if len(pay) == 0 {
		return
	}
	// One call for the grants of pay, but one of its own for each grant of
	// an entry whose call ran out its DeliverTimeout before (Worker.alone):
	// those calls run at once, so the grant the sink hangs on holds no
	// other.
	var alone [][]int // places in pay, a call each
	var together []int
	for j := range pay {
		if w.alone(b.stream, b.ids[payAt[j]]) {
			alone = append(alone, []int{j})
		} else {
			together = append(together, j)
		}
	}
	var mu sync.Mutex // guards b and the outcome of each grant
	if len(alone) == 0 {
		w.payCall(ctx, sh, b, p, pay, payAt, together, false, &mu)
		return
	}
	var wg sync.WaitGroup
	for _, call := range alone {
		wg.Go(func() { w.payCall(ctx, sh, b, p, pay, payAt, call, true, &mu) })
	}
	if len(together) > 0 {
		wg.Go(func() { w.payCall(ctx, sh, b, p, pay, payAt, together, false, &mu) })
	}
	wg.Wait()
}

// payCall delivers the grants of pay at the places call in one call to the
// sink, in the places deliverSlot takes (alone: a grant tried on its own),
// and notes what became of each (b.settled; a failure tried again later; a
// serial conflict left for an operator). mu guards b.
func (w *Worker) payCall(ctx context.Context, sh *shardLoop, b *batch, p *pass, pay []Grant, payAt, call []int, alone bool, mu *sync.Mutex) {
	if !w.deliverSlot(ctx, sh, alone) {
		if ctx.Err() != nil {
			return
		}
		// Every call the shard may have in flight hangs: these grants are
		// confirmed (kept past their hold) and delivered later, as if
		// their delivery had failed.
		w.cfg.Logger.Warn("settle: deliveries put off while the shard's calls to the sink hang", "stream", b.stream, "grants", len(call), "calls", maxCalls)
		for _, j := range call {
			p.behind(b.ids[payAt[j]])
			w.noPlace(b.stream, b.ids[payAt[j]], time.Now())
		}
		return
	}
	gs := make([]Grant, len(call))
	for k, j := range call {
		gs[k] = pay[j]
	}
	answers, timedOut := w.deliver(ctx, sh, gs, alone)
	mu.Lock()
	defer mu.Unlock()
	for k, err := range answers {
		j := call[k]
		i := payAt[j]
		g := pay[j]
		switch {
		case err == nil && g.Unpaid == Released:
			w.expired.Add(1) // released at its deadline first: not paid
			w.mark(b, i, expiredOut)
			b.settled(i)
		case err == nil && g.Unpaid != "":
			w.unmatchedGrant(g)
			w.mark(b, i, unmatched)
			b.settled(i)
		case err == nil:
			w.delivered.Add(1)
			w.mark(b, i, paidOut)
			b.settled(i)
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrPaid):
			// Paid (by another worker, or by this one before it was
			// restarted), and its shard released it or holds no such
			// grant: the shard lost the confirm, and the amount is back in
			// the stock. Marked paid, so that this worker does not ask
			// again, and left for an operator.
			w.marks.set(b.outbox(), b.ids[i], g.Serial, paidOut)
			w.leftForOperator(p, b.stream, b.ids[i], strconv.FormatInt(g.Serial, 10),
				fmt.Errorf("%s serial %d was paid, and its shard says %s: it lost the confirm, and its amount is back in the stock: %w", g, g.Serial, g.Unpaid, err))
		case errors.Is(err, ErrSerialConflict), errors.Is(err, ErrSettledUnpaid):
			w.leftForOperator(p, b.stream, b.ids[i], strconv.FormatInt(g.Serial, 10), err)
		default:
			// Tried again after a wait of its own (retryLater), not the
			// shard's: the other entries keep being paid meanwhile; on
			// their own, if their call of several ran out its time.
			p.behind(b.ids[i])
			w.failures.Add(1)
			b.retryLater(b.ids[i], (timedOut || errors.Is(err, ErrBusy)) && len(call) > 1)
			w.cfg.Logger.Warn("settle: delivery failed; entry left pending", "stream", b.stream, "id", b.ids[i], "serial", pay[j].Serial, "err", err)
		}
	}
}

// leftForOperator counts and logs, once per entry and grant (serial: the
// grant's, with its place in the entry for a damaged one; "" for the whole
// entry) though it is met on every pass, an entry left pending for an
// operator, and notes the entry in the pass (Stats.LeftForOperator).
func (w *Worker) leftForOperator(p *pass, stream, id, serial string, err error) {
	p.leave(stream + " " + id)
	w.awaitingOperator.Store(stream+" "+id, true)
	if _, seen := w.conflicted.LoadOrStore(stream+" "+id+" "+serial, true); !seen {
		w.conflicts.Add(1)
		w.cfg.Logger.Error("settle: entry left pending for an operator", "stream", stream, "id", id, "serial", serial, "err", err)
	}
}

// errNotReplicated is a confirm no replica acknowledged in time: a
// failover could lose it, and the reaper would then release (and the
// claim path grant again) what was paid. Nothing is paid; the entries stay
// pending.
var errNotReplicated = errors.New("settle: no replica confirmed the confirm in time")

// confirm confirms a batch of grants of sub-pool k (lua.ConfirmMany). On a
// shard with replicas the confirm is followed on the same connection by
// WAIT 1, as the claim path's batches are: only a confirm a replica holds
// is paid, so a failover cannot undo it after the payout. On a cluster
// shard it runs on the primary rain's slot map names (shard.Set.Writer);
// one that answers ASK (the sub-pool's slot is being moved, its keys gone,
// or a move was left half done) sends it to the node the keys went to,
// after ASKING, waiting there for that primary's replica when it has one:
// the grants made there meanwhile (the claim path follows ASK too) are
// confirmed and paid, not left to lapse until the move is finished.
func (w *Worker) confirm(ctx context.Context, sh *shardLoop, k *rain.Keys, args []lua.ConfirmArg) ([]lua.ConfirmResult, []error, error) {
	c, replicated, err := w.shards.Writer(ctx, sh.name, k.Meta)
	if err != nil {
		return nil, nil, err
	}
	res, errs, err := w.confirmOn(ctx, c, replicated, false, k, args)
	if addr, ok := shard.AskedTo(err); ok {
		if n := w.shards.Node(sh.name, addr); n != nil {
			res, errs, err = w.confirmOn(ctx, n, w.shards.NodeReplicated(sh.name, addr), true, k, args)
		}
	}
	return res, errs, w.shards.Redirected(ctx, sh.name, err)
}

// confirmOn runs confirm's script on c, after ASKING when asking (the
// slot is moving to c's node), followed on the same connection by WAIT 1
// when replicated.
func (w *Worker) confirmOn(ctx context.Context, c redis.UniversalClient, replicated, asking bool, k *rain.Keys, args []lua.ConfirmArg) ([]lua.ConfirmResult, []error, error) {
	if !replicated && !asking {
		return lua.ConfirmMany(ctx, c, k, args)
	}
	run := func() (*redis.Cmd, *redis.IntCmd) {
		pipe := c.Pipeline()
		if asking {
			_ = pipe.Process(ctx, redis.NewStatusCmd(ctx, "asking"))
		}
		cmd := lua.ConfirmManyCmd(ctx, pipe, k, replicated, args)
		var wait *redis.IntCmd
		if replicated {
			wait = redis.NewIntCmd(ctx, "wait", 1, (w.shards.Timeout() / 2).Milliseconds())
			_ = pipe.Process(ctx, wait)
		}
		_, _ = pipe.Exec(ctx) // errors are per command, read below
		return cmd, wait
	}
	cmd, wait := run()
	if lua.IsNoScript(cmd.Err()) { // nothing ran: load the scripts, send it again
		if err := lua.LoadScripts(ctx, c); err != nil {
			return nil, nil, err
		}
		cmd, wait = run()
	}
	res, errs, err := lua.ParseConfirmMany(cmd, len(args))
	if err != nil {
		return nil, nil, err
	}
	if wait != nil {
		if n, werr := wait.Result(); werr != nil || n < 1 {
			return nil, nil, fmt.Errorf("%w (WAIT answered %d, %v)", errNotReplicated, n, werr)
		}
	}
	return res, errs, nil
}

// parseGrants reads an entry of b's stream (lua.ParseOutboxEntries): its
// grants (several for an entry of a batch's grants), or release true for
// a release (not paid). A packed entry's pool and sub-pool are its
// stream's. A grant's time is the entry id's (the stream's own clock, ms).
func (b *batch) parseGrants(m redis.XMessage) (gs []Grant, release bool, err error) {
	es, err := lua.ParseOutboxEntries(m.Values)
	if err != nil || es[0].Release {
		return nil, es[0].Release, err
	}
	ms, _, _ := strings.Cut(m.ID, "-")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return nil, false, fmt.Errorf("entry id %q: %w", m.ID, err)
	}
	gs = make([]Grant, len(es))
	for i, e := range es {
		g := Grant{PoolID: e.Pool, SubPool: e.Sub, UserID: e.User, AmountCents: e.Amount, Serial: e.Serial, DeadlineMS: e.DeadlineMS,
			GrantedAt: time.UnixMilli(at).UTC()}
		if e.Pool == "" {
			if !b.spOK {
				return nil, false, fmt.Errorf("stream %q is no sub-pool's outbox", b.stream)
			}
			g.PoolID, g.SubPool = b.sp.Pool, b.sp.Index
		}
		if !rain.ValidID(g.PoolID) || !rain.ValidID(g.UserID) {
			return nil, false, errors.New("bad pool or user id")
		}
		gs[i] = g
	}
	return gs, false, nil
}
