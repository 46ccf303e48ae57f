package settle

// This file is what a sink receives (Grant) and what it promises (Sink):
// the contract internal/postgres, internal/ledger and internal/webhook
// keep.

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Grant is one grant of an outbox, as a sink receives it.
type Grant struct {
	Serial      int64     `json:"serial"`
	PoolID      string    `json:"pool_id"`
	SubPool     int       `json:"sub_pool"`
	UserID      string    `json:"user_id"`
	AmountCents int64     `json:"amount_cents"`
	DeadlineMS  int64     `json:"deadline_ms"`
	GrantedAt   time.Time `json:"granted_at"` // when it was made, by its shard's clock
}

// Same reports whether g and o are one grant: the same serial for the same
// pool, sub-pool, user and amount. (The deadline and the time are not
// compared: they are the grant's, but a re-made grant after a lost write
// has others.)
func (g Grant) Same(o Grant) bool {
	return g.Serial == o.Serial && g.PoolID == o.PoolID && g.SubPool == o.SubPool &&
		g.UserID == o.UserID && g.AmountCents == o.AmountCents
}

func (g Grant) String() string {
	return fmt.Sprintf("pool %s sub-pool %d user %s %d cents", g.PoolID, g.SubPool, g.UserID, g.AmountCents)
}

// ErrSerialConflict is returned by a Sink when a grant's serial was paid
// before for another pool, sub-pool, user or amount: serials are unique, so
// one of the two is wrong (a serial handed out twice, a shard that lost
// writes). It is an alarm, never a silent skip: the worker leaves the entry
// pending and counts it.
var ErrSerialConflict = errors.New("settle: serial already paid for another grant")

// Sink receives confirmed grants, in batches. Deliver returns one error per
// grant of gs (nil: delivered, now or before). It may see a grant more than
// once (after a crash, or from another worker that took the entry over)
// and must pay it once: dedupe by Serial, across every worker that
// delivers to it. A serial seen before with another grant (Grant.Same) is
// not a repeat: its error is ErrSerialConflict and nothing is paid. Any
// other error leaves the grant to be delivered again later.
type Sink interface {
	Deliver(ctx context.Context, gs []Grant) []error
}
