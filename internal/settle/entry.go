package settle

// This file is one outbox entry settled: confirm, deliver, acknowledge.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"rain/internal/catalog"
	"rain/internal/lua"
	"rain/internal/wait"
)

// handleAll handles msgs in order and stops at the first that fails (it
// and those after it stay pending for the next pass), noting it in p.
func (w *Worker) handleAll(ctx context.Context, c *redis.Client, stream string, msgs []redis.XMessage, p *pass) {
	for _, m := range msgs {
		err := w.handle(ctx, c, stream, m)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrSerialConflict):
			// Left pending for an operator; the other entries go on. Counted
			// and logged once per entry, though it is met on every pass.
			if _, seen := w.conflicted.LoadOrStore(stream+" "+m.ID, true); seen {
				continue
			}
			w.conflicts.Add(1)
			w.cfg.Logger.Error("settle: serial already paid for another grant; entry left pending for an operator",
				"stream", stream, "id", m.ID, "err", err)
		default:
			// Left pending: retried on the next pass over own pending entries.
			p.behind(m.ID)
			w.failures.Add(1)
			w.cfg.Logger.Warn("settle: entry left pending", "stream", stream, "id", m.ID, "err", err)
			_ = wait.For(ctx, w.cfg.RetryDelay)
			return
		}
	}
}

// handle settles one entry: confirm, deliver, acknowledge.
func (w *Worker) handle(ctx context.Context, c *redis.Client, stream string, m redis.XMessage) error {
	if m.Values["type"] != "grant" {
		return c.XAck(ctx, stream, w.cfg.Group, m.ID).Err()
	}
	g, err := parseGrant(m.Values)
	if err != nil {
		w.anomalies.Add(1)
		w.cfg.Logger.Error("settle: unreadable outbox entry; acknowledged", "stream", stream, "id", m.ID, "err", err)
		return c.XAck(ctx, stream, w.cfg.Group, m.ID).Err()
	}
	k := lua.SubPool{Pool: g.PoolID, Index: g.SubPool}.Keys()
	res, err := lua.Confirm(ctx, c, &k, g.UserID, g.Serial)
	if err != nil {
		return fmt.Errorf("confirm serial %d: %w", g.Serial, err)
	}
	switch res {
	case lua.Confirmed, lua.AlreadyConfirmed:
		if err := w.sink.Deliver(ctx, g); err != nil {
			return fmt.Errorf("deliver serial %d: %w", g.Serial, err)
		}
		w.delivered.Add(1)
	case lua.WasReleased:
		w.expired.Add(1)
	default:
		w.anomalies.Add(1)
		w.cfg.Logger.Error("settle: outbox grant has no matching grant; acknowledged",
			"pool_id", g.PoolID, "user_id", g.UserID, "serial", g.Serial)
	}
	return c.XAck(ctx, stream, w.cfg.Group, m.ID).Err()
}

func parseGrant(v map[string]any) (Grant, error) {
	s := func(k string) string { x, _ := v[k].(string); return x }
	n := func(k string) (int64, error) { return strconv.ParseInt(s(k), 10, 64) }
	g := Grant{PoolID: s("pool"), UserID: s("user")}
	var err error
	var sub int64
	if g.Serial, err = n("serial"); err != nil {
		return g, fmt.Errorf("serial: %w", err)
	}
	if g.AmountCents, err = n("amount"); err != nil {
		return g, fmt.Errorf("amount: %w", err)
	}
	if g.DeadlineMS, err = n("deadline_ms"); err != nil {
		return g, fmt.Errorf("deadline_ms: %w", err)
	}
	if sub, err = n("sub"); err != nil {
		return g, fmt.Errorf("sub: %w", err)
	}
	g.SubPool = int(sub)
	if !catalog.ValidID(g.PoolID) || !catalog.ValidID(g.UserID) {
		return g, errors.New("bad pool or user id")
	}
	return g, nil
}
