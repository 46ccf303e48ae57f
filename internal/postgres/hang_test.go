package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"rain"
	"rain/internal/grab"
	"rain/internal/grabtest"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/wait/waittest"
)

// TestHungDeliveryShows: settlement whose database call hangs (a table
// lock held by another session: a migration, an operator's open
// transaction) shows it at once: the lag grows from the oldest entry it is
// settling, though the pass never ends; the delivery fails after the
// lock timeout of a delivery (lockTimeout, under DeliverTimeout) and
// counts; once the lock goes, every grant is paid.
func TestHungDeliveryShows(t *testing.T) {
	ctx := context.Background()
	db, url := open(t)
	ge := grabtest.Start(t, 2, redistest.Options{})
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: 100_000, Count: 1000, SubPools: 2}); err != nil {
		t.Fatal(err)
	}
	grabN := func(prefix string, n int) {
		for u := range n {
			if r, err := ge.Service.Grab(ctx, "p", fmt.Sprintf("%s%d", prefix, u)); err != nil || r.Outcome != grab.Granted {
				t.Fatalf("grab = %+v, %v", r, err)
			}
		}
	}
	grabN("a", 10)
	w := runWorker(t, ge, db, 3*time.Second)
	waittest.Until(t, 20*time.Second, "the first grants delivered", func() bool { return w.Stats().Delivered == 10 })
	locker, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()
	tx, err := locker.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, "LOCK TABLE rain_grants IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	grabN("b", 10)
	waittest.Until(t, 20*time.Second, "the lag past 1s while the delivery hangs, before it times out", func() bool {
		st := w.Stats()
		return st.Lag > time.Second && st.Failures == 0
	})
	waittest.Until(t, 20*time.Second, "the hung delivery failed and counted", func() bool { return w.Stats().Failures > 0 })
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 30*time.Second, "every grant paid once the lock is gone", func() bool { return w.Stats().Delivered == 20 })
}

// TestAHeldSerialHoldsUpNoOtherGrant: another session holds one serial
// of the grants to pay (a transaction left open by hand, an application
// of the wallet side). Its delivery waits the lock timeout and fails with
// the grants of its call (settle.ErrBusy); from then on each of them goes
// to the database in a call of its own, so every other grant is paid
// while the serial is held, and the held one once it is let go.
func TestAHeldSerialHoldsUpNoOtherGrant(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	ge := grabtest.Start(t, 1, redistest.Options{})
	if _, _, err := ge.Catalog.Preload(ctx, rain.Spec{PoolID: "p", TotalCents: 100_000, Count: 1000, SubPools: 1}); err != nil {
		t.Fatal(err)
	}
	var held int64
	for u := range 11 {
		r, err := ge.Service.Grab(ctx, "p", fmt.Sprintf("u%d", u))
		if err != nil || r.Outcome != grab.Granted {
			t.Fatalf("grab = %+v, %v", r, err)
		}
		if u == 3 {
			held = r.Serial
		}
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(ctx, `INSERT INTO rain_grants (serial, pool_id, sub_pool, user_id, amount_cents, granted_at)
		VALUES ($1, 'p', 0, 'u3', 1, now())`, held); err != nil {
		t.Fatal(err)
	}
	w := runWorker(t, ge, db, 30*time.Second)
	waittest.Until(t, 30*time.Second, "every grant but the held one paid while it is held", func() bool {
		return w.Stats().Delivered == 10
	})
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 60*time.Second, "the held grant paid once let go (after its retry's wait)", func() bool { return w.Stats().Delivered == 11 })
}

// runWorker runs a settle worker into db on ge's shards, with short
// timings and deliverTimeout, until the test ends.
func runWorker(t *testing.T, ge *grabtest.Env, db *DB, deliverTimeout time.Duration) *settle.Worker {
	w := settle.New(ge.Shards, ge.Catalog, db, settle.Config{Consumer: "c", Batch: 5, Block: 50 * time.Millisecond,
		Refresh: 50 * time.Millisecond, ClaimAfter: 200 * time.Millisecond, RetryDelay: 20 * time.Millisecond,
		DeliverTimeout: deliverTimeout})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return w
}
