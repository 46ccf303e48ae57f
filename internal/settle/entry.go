package settle

// This file is one batch of outbox entries settled: the grants confirmed in
// one script (and, on a shard with replicas, on a replica before anything
// is paid), delivered in one call to the sink, and every entry settled
// acknowledged and trimmed from the stream in one script.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/lua"
)

// batch is one stream's entries of a read, as settleBatch sorts them.
type batch struct {
	stream string
	sp     rain.SubPool // the stream's sub-pool, when spOK (rain.ParseOutbox)
	spOK   bool
	done   []string // ids of the entries settled: acknowledged and trimmed
	grants []Grant  // grant entries to confirm and deliver
	ids    []string // their ids
}

// settleBatch settles msgs, the entries of one outbox (one sub-pool), in
// one confirm script, one delivery and one acknowledgment. An entry it
// cannot read is acknowledged only when it is a release (which pays
// nothing); any other is left pending for an operator. An entry whose
// confirm or delivery fails stays pending (retried on the next pass over
// the worker's own pending entries), and so does one whose serial the
// sink paid for another grant (left for an operator); every other entry is
// acknowledged and deleted from the stream, so that an outbox holds what
// is unsettled, not everything ever granted. It reports whether an entry
// was left pending for a failure (the caller then waits RetryDelay).
func (w *Worker) settleBatch(ctx context.Context, sh *shardLoop, stream string, msgs []redis.XMessage, p *pass) (failed bool) {
	b := batch{stream: stream}
	b.sp, b.spOK = rain.ParseOutbox(stream)
	for _, m := range msgs {
		g, release, err := b.parseGrant(m)
		switch {
		case err != nil && release:
			w.anomalies.Add(1)
			w.cfg.Logger.Error("settle: unreadable release entry; acknowledged", "stream", stream, "id", m.ID, "err", err)
			b.done = append(b.done, m.ID) // a release pays nothing
		case err != nil:
			// Perhaps a grant, or a form a later rain writes: acknowledged,
			// it would never be paid, and its grant would be released at its
			// deadline. Left pending for an operator, as a mismatch is.
			w.leftForOperator(p, stream, m.ID, fmt.Errorf("unreadable outbox entry: %w", err))
		case release:
			b.done = append(b.done, m.ID) // not paid
		default:
			b.grants, b.ids = append(b.grants, g), append(b.ids, m.ID)
		}
	}
	if len(b.grants) > 0 {
		failed = w.settleGrants(ctx, sh, &b, p)
	}
	if len(b.done) > 0 {
		if err := lua.Acknowledge(ctx, sh.c, stream, w.cfg.Group, b.done); err != nil && ctx.Err() == nil {
			// Pending still: settled again, at no cost (confirm and the
			// sinks are idempotent), on the next pass.
			w.cfg.Logger.Warn("settle: acknowledge", "stream", stream, "err", err)
			p.behindAll(b.done)
			failed = true
		}
	}
	return failed
}

// settleGrants confirms b's grants, delivers those confirmed, and adds
// what is settled to b.done. It reports whether some are left pending for
// a failure.
func (w *Worker) settleGrants(ctx context.Context, sh *shardLoop, b *batch, p *pass) (failed bool) {
	sp := b.sp
	if !b.spOK {
		g0 := b.grants[0]
		sp = rain.SubPool{Pool: g0.PoolID, Index: g0.SubPool}
	}
	k := sp.Keys()
	args := make([]lua.ConfirmArg, len(b.grants))
	for i, g := range b.grants {
		args[i] = lua.ConfirmArg{User: g.UserID, Serial: g.Serial, Amount: g.AmountCents}
	}
	res, errs, err := w.confirm(ctx, sh, &k, args)
	if err != nil {
		if ctx.Err() == nil {
			w.failures.Add(int64(len(b.grants)))
			w.cfg.Logger.Warn("settle: confirm; entries left pending", "stream", b.stream, "entries", len(b.grants), "err", err)
		}
		p.behindAll(b.ids)
		return true
	}
	var pay []Grant
	var payIDs []string
	for i, g := range b.grants {
		switch {
		case errs[i] != nil:
			w.failures.Add(1)
			w.cfg.Logger.Error("settle: confirm of one grant failed; entry left pending", "stream", b.stream, "id", b.ids[i], "err", errs[i])
			p.behind(b.ids[i])
			failed = true
		case res[i].Result == lua.Confirmed || res[i].Result == lua.AlreadyConfirmed:
			pay, payIDs = append(pay, g), append(payIDs, b.ids[i])
		case res[i].Result == lua.WasReleased:
			w.expired.Add(1) // released at its deadline first: not paid
			b.done = append(b.done, b.ids[i])
		case res[i].Result == lua.AmountMismatch:
			// The entry would pay another amount than the grant holds:
			// nothing is confirmed or paid; left pending for an operator
			// (the pool cannot close until one looks).
			w.leftForOperator(p, b.stream, b.ids[i], fmt.Errorf("outbox entry of %s serial %d pays %d cents; the grant holds %d",
				g, g.Serial, g.AmountCents, res[i].Amount))
		default:
			w.anomalies.Add(1)
			w.cfg.Logger.Error("settle: outbox grant has no matching grant; acknowledged",
				"pool_id", g.PoolID, "user_id", g.UserID, "serial", g.Serial)
			b.done = append(b.done, b.ids[i])
		}
	}
	if len(pay) == 0 {
		return failed
	}
	dctx, cancel := context.WithTimeout(ctx, w.cfg.DeliverTimeout)
	defer cancel()
	for i, err := range w.sink.Deliver(dctx, pay) {
		switch {
		case err == nil:
			w.delivered.Add(1)
			b.done = append(b.done, payIDs[i])
		case ctx.Err() != nil:
			return failed
		case errors.Is(err, ErrSerialConflict):
			w.leftForOperator(p, b.stream, payIDs[i], err)
		default:
			p.behind(payIDs[i])
			w.failures.Add(1)
			w.cfg.Logger.Warn("settle: delivery failed; entry left pending", "stream", b.stream, "id", payIDs[i], "err", err)
			failed = true
		}
	}
	return failed
}

// leftForOperator counts and logs, once per entry though it is met on
// every pass, an entry left pending for an operator, and notes it in the
// pass (Stats.LeftForOperator).
func (w *Worker) leftForOperator(p *pass, stream, id string, err error) {
	p.leave(stream + " " + id)
	if _, seen := w.conflicted.LoadOrStore(stream+" "+id, true); !seen {
		w.conflicts.Add(1)
		w.cfg.Logger.Error("settle: entry left pending for an operator", "stream", stream, "id", id, "err", err)
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
// is paid, so a failover cannot undo it after the payout.
func (w *Worker) confirm(ctx context.Context, sh *shardLoop, k *rain.Keys, args []lua.ConfirmArg) ([]lua.ConfirmResult, []error, error) {
	c, replicated, err := w.shards.Writer(ctx, sh.name, k.Meta)
	if err != nil {
		return nil, nil, err
	}
	if !replicated {
		return lua.ConfirmMany(ctx, c, k, args)
	}
	run := func() (*redis.Cmd, *redis.IntCmd) {
		pipe := c.Pipeline()
		cmd := lua.ConfirmManyCmd(ctx, pipe, k, args)
		wait := redis.NewIntCmd(ctx, "wait", 1, (w.shards.Timeout() / 2).Milliseconds())
		_ = pipe.Process(ctx, wait)
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
	if n, werr := wait.Result(); werr != nil || n < 1 {
		return nil, nil, fmt.Errorf("%w (WAIT answered %d, %v)", errNotReplicated, n, werr)
	}
	return res, errs, nil
}

// parseGrant reads an entry of b's stream (lua.ParseOutboxEntry): a
// grant, or release true for a release (not paid). A packed entry's pool
// and sub-pool are its stream's. The grant's time is the entry id's (the
// stream's own clock, ms).
func (b *batch) parseGrant(m redis.XMessage) (g Grant, release bool, err error) {
	e, err := lua.ParseOutboxEntry(m.Values)
	if err != nil || e.Release {
		return g, e.Release, err
	}
	g = Grant{PoolID: e.Pool, SubPool: e.Sub, UserID: e.User, AmountCents: e.Amount, Serial: e.Serial, DeadlineMS: e.DeadlineMS}
	if e.Pool == "" {
		if !b.spOK {
			return g, false, fmt.Errorf("stream %q is no sub-pool's outbox", b.stream)
		}
		g.PoolID, g.SubPool = b.sp.Pool, b.sp.Index
	}
	if !rain.ValidID(g.PoolID) || !rain.ValidID(g.UserID) {
		return g, false, errors.New("bad pool or user id")
	}
	ms, _, _ := strings.Cut(m.ID, "-")
	at, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return g, false, fmt.Errorf("entry id %q: %w", m.ID, err)
	}
	g.GrantedAt = time.UnixMilli(at).UTC()
	return g, false, nil
}
