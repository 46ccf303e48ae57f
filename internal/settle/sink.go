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
	// Unpaid, when not "", says the grant is settled without a payout, and
	// why: Released or Unmatched. Only a sink that records such grants
	// (RecordsUnpaid) is given them.
	Unpaid string `json:"unpaid,omitempty"`
}

// Why a grant is settled unpaid (Grant.Unpaid).
const (
	// Released: its shard released it at its deadline, unconfirmed; its
	// amount is back in the stock.
	Released = "released"
	// Unmatched: its shard holds no grant of that serial for the user (a
	// shard that lost writes); an anomaly.
	Unmatched = "unmatched"
)

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

// ErrPaid is returned by a sink that records unpaid grants for a grant
// given unpaid (Grant.Unpaid) whose serial it paid: the worker's shard says
// the grant was released (its amount back in the stock) or holds no such
// grant, yet it was paid, by another worker or before a failover took the
// confirm back. Nothing is recorded; the worker leaves the entry pending
// for an operator.
var ErrPaid = errors.New("settle: the sink paid this serial")

// ErrBusy is returned by a sink for the grants of a delivery that waited
// too long for a serial another holds (a delivery of it in flight, or an
// open transaction in the database): nothing was settled. The worker
// delivers them again later, each in a call of its own, as after a call
// that ran out its DeliverTimeout, so that the grant held up holds up no
// other.
var ErrBusy = errors.New("settle: a serial of the delivery is held by another")

// ErrSettledUnpaid is returned by a sink that records unpaid grants for a
// grant to pay whose serial it recorded as settled unpaid: nothing is
// paid; the worker leaves the entry pending for an operator.
var ErrSettledUnpaid = errors.New("settle: the sink recorded this serial as settled unpaid")

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

// RecordsUnpaid is a Sink that also records, under their serials, the
// grants settlement settles without a payout (Grant.Unpaid: released at
// their deadline, or matching no grant of their shard), in the same
// Deliver calls as the grants it pays, and answers for each serial the one
// way it was settled, atomically across every worker:
//
//   - an unpaid grant whose serial it paid is ErrPaid, and one to pay
//     whose serial it recorded unpaid ErrSettledUnpaid (nothing changes
//     in either case);
//   - the same grant given the same way again is a repeat (nil);
//   - another grant under a serial it holds is ErrSerialConflict.
//
// So a worker that does not know what another paid (restarted, or taking
// an entry over), or a delivery still in flight on another worker, never
// turns a paid grant into a released one: the worker asks the sink by
// settling it there. RecordsUnpaid reports whether the sink does; a sink
// that does not is given only grants to pay, and the worker settles unpaid
// grants on what it remembers alone (Worker.marks).
type RecordsUnpaid interface {
	Sink
	RecordsUnpaid() bool
}
