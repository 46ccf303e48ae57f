package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain"
	"rain/internal/pgtest"
	"rain/internal/settle"
	"rain/internal/settle/sinktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// open starts a server and opens a fresh database on it.
func open(t *testing.T) (*DB, string) {
	t.Helper()
	srv := pgtest.Start(t, pgtest.Options{})
	url := srv.NewDB(t)
	db, err := Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	return db, url
}

// TestMigrationsOnce: workers opening one database at once apply each
// migration once (the advisory lock); opening again applies nothing.
func TestMigrationsOnce(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	url := srv.NewDB(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			db, err := Open(context.Background(), url)
			if err == nil {
				db.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open #%d at once: %v", i, err)
		}
	}
	db, err := Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.pool.QueryRow(context.Background(), "SELECT count(*) FROM rain_migrations").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if want := len(must(migrations.ReadDir("migrations"))); n != want {
		t.Fatalf("%d migrations recorded, want %d (each once)", n, want)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// sumTotals is what db.Totals gives of pool "p", summed over its
// sub-pools.
func sumTotals(t *testing.T, db *DB) (count, cents int64) {
	t.Helper()
	totals, err := db.Totals(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range totals {
		count, cents = count+tl.Count, cents+tl.Cents
	}
	return count, cents
}

func grant(serial int64, user string, cents int64) settle.Grant {
	return settle.Grant{Serial: serial, PoolID: "p", SubPool: int(serial % 2), UserID: user, AmountCents: cents,
		GrantedAt: time.UnixMilli(1_800_000_000_000 + serial).UTC()}
}

// TestDeliver: a batch is inserted; the same grant again is a repeat; a
// serial held for another grant is settle.ErrSerialConflict, and the row
// stays the first; two workers delivering the same batches at once leave
// one row per serial.
func TestDeliver(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	first := []settle.Grant{grant(1, "a", 10), grant(2, "b", 20), grant(3, "c", 30)}
	for i, err := range db.Deliver(ctx, first) {
		if err != nil {
			t.Fatalf("Deliver of grant %d: %v", i, err)
		}
	}
	again := []settle.Grant{grant(2, "b", 20), grant(4, "d", 40), grant(3, "someone else", 30), grant(4, "d", 40)}
	errs := db.Deliver(ctx, again)
	for i, want := range []error{nil, nil, settle.ErrSerialConflict, nil} {
		if !errors.Is(errs[i], want) || (want == nil && errs[i] != nil) {
			t.Fatalf("Deliver of %+v: %v, want %v", again[i], errs[i], want)
		}
	}
	var user string
	if err := db.pool.QueryRow(ctx, "SELECT user_id FROM rain_grants WHERE serial = 3").Scan(&user); err != nil || user != "c" {
		t.Fatalf("serial 3 is %q (%v) after a conflicting delivery, want the first grant's c", user, err)
	}
	// Two workers at once, the same grants.
	var batch []settle.Grant
	for s := int64(100); s < 600; s++ {
		batch = append(batch, grant(s, fmt.Sprint("u", s), s))
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for _, err := range db.Deliver(ctx, batch) {
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	count, cents := sumTotals(t, db)
	if count != 4+500 || cents != 100+(100+599)*500/2 {
		t.Fatalf("totals: %d grants, %d cents; want one row per serial: 504, %d", count, cents, 100+(100+599)*500/2)
	}
}

// TestDeliverOneSerialTwiceInABatch: a batch holding two different grants
// under one serial pays the first and answers the second
// settle.ErrSerialConflict (it is never counted delivered); the same grant
// twice in a batch is one row, delivered.
func TestDeliverOneSerialTwiceInABatch(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	batch := []settle.Grant{grant(7, "a", 10), grant(8, "b", 20), grant(7, "mallory", 99), grant(8, "b", 20)}
	errs := db.Deliver(ctx, batch)
	for i, want := range []error{nil, nil, settle.ErrSerialConflict, nil} {
		if !errors.Is(errs[i], want) || (want == nil && errs[i] != nil) {
			t.Fatalf("Deliver of %+v in one batch: %v, want %v", batch[i], errs[i], want)
		}
	}
	count, cents := sumTotals(t, db)
	if count != 2 || cents != 30 {
		t.Fatalf("the database holds %d grants, %d cents; want the first grant of each serial: 2, 30", count, cents)
	}
}

// TestDeliverToADeadDatabase: with the database gone every grant of the
// batch fails (nothing is acknowledged); settlement delivers them again.
func TestDeliverToADeadDatabase(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	db, err := Open(context.Background(), srv.NewDB(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	srv.Stop()
	for i, err := range db.Deliver(context.Background(), []settle.Grant{grant(1, "a", 1), grant(2, "b", 2)}) {
		if err == nil {
			t.Fatalf("Deliver of grant %d to a stopped database succeeded", i)
		}
	}
}

// TestRecord: an account is recorded once; the same sums again (a resumed
// close, its time anew) are a no-op; other sums are ErrAccountConflict.
func TestRecord(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	a := &rain.Account{PoolID: "p", State: "closed", PreloadedCount: 10, PreloadedCents: 100, ConfirmedCount: 6,
		ConfirmedCents: 70, UnclaimedCount: 4, UnclaimedCents: 30, ClosedAt: time.UnixMilli(1_800_000_000_000).UTC(),
		SubPools: []rain.SubPoolAccount{{Index: 0, ConfirmedCount: 6, ConfirmedCents: 70, UnclaimedCount: 4, UnclaimedCents: 30}}}
	if err := db.Record(ctx, a); err != nil {
		t.Fatal(err)
	}
	later := *a
	later.ClosedAt = later.ClosedAt.Add(time.Minute)
	if err := db.Record(ctx, &later); err != nil {
		t.Fatalf("Record of the same account, later: %v", err)
	}
	other := *a
	other.ConfirmedCents, other.UnclaimedCents = 60, 40
	if err := db.Record(ctx, &other); !errors.Is(err, ErrAccountConflict) {
		t.Fatalf("Record of other sums = %v, want ErrAccountConflict", err)
	}
	got, err := db.Account(ctx, "p")
	if err != nil || !got.ClosedAt.Equal(a.ClosedAt) || got.ConfirmedCents != 70 || len(got.SubPools) != 1 {
		t.Fatalf("Account = %+v, %v; want the first", got, err)
	}
}

// TestUnpaidOneWayEach: the database records the grants settled unpaid
// (rain_unpaid) and answers for each serial the one way it was settled
// (settle.RecordsUnpaid); what a close reads of a user (Settled) follows.
func TestUnpaidOneWayEach(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	sinktest.OneWayEach(t, db)
	for _, c := range []struct {
		user           string
		paid, released []int64
	}{{"a", nil, []int64{1}}, {"b", []int64{2}, nil}, {"c", nil, nil}, {"d", nil, []int64{4}}, {"e", []int64{5}, nil}} {
		paid, released, err := db.Settled(ctx, "p", c.user)
		if err != nil || !slices.Equal(paid, c.paid) || !slices.Equal(released, c.released) {
			t.Fatalf("Settled(p, %s) = %v, %v, %v; want paid %v, released %v (an unmatched grant is neither)", c.user, paid, released, err, c.paid, c.released)
		}
	}
	count, cents := sumTotals(t, db)
	if count != 2 || cents != 70 {
		t.Fatalf("Totals count %d grants, %d cents; want the 2 paid, 70 cents (what was settled unpaid is not in them)", count, cents)
	}
}

// TestPaidAndUnpaidAtOnce: one serial delivered to pay by one worker and
// unpaid by another, at once, is settled one way (rain_grants' key); many
// serials, each raced so. The same on a database whose transactions are
// REPEATABLE READ by default: Deliver's own are READ COMMITTED.
func TestPaidAndUnpaidAtOnce(t *testing.T) {
	ctx := context.Background()
	db, url := open(t)
	sinktest.Race(t, db, 1000, 200)
	if _, err := db.pool.Exec(ctx, "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = %L', current_database(), 'repeatable read'); END $$"); err != nil {
		t.Fatal(err)
	}
	rr, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer rr.Close()
	var level string
	if err := rr.pool.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&level); err != nil || level != "repeatable read" {
		t.Fatalf("default_transaction_isolation = %q, %v; want repeatable read", level, err)
	}
	sinktest.Race(t, rr, 2000, 200)
}

// TestAHungPaymentHoldsOnlyItsSerial: a transaction that holds serial 1
// (a payment that hangs: its worker's host lost mid-delivery) makes a
// record of serial 1 unpaid wait for it, at most lockTimeout, and fail
// then (it is delivered again later), and nothing else: a payment of
// serial 2 and a record of serial 3 unpaid go through meanwhile. Once the
// hung payment commits, serial 1 is paid.
func TestAHungPaymentHoldsOnlyItsSerial(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	hung, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Rollback(ctx)
	g := sinktest.Grant(1, "a", 10, "")
	if _, err := hung.Exec(ctx, `INSERT INTO rain_grants (serial, pool_id, sub_pool, user_id, amount_cents, granted_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, g.Serial, g.PoolID, g.SubPool, g.UserID, g.AmountCents, g.GrantedAt); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		waiting <- db.Deliver(ctx, []settle.Grant{sinktest.Grant(1, "a", 10, settle.Released)})[0]
	}()
	others, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i, err := range db.Deliver(others, []settle.Grant{sinktest.Grant(2, "b", 20, ""), sinktest.Grant(3, "c", 30, settle.Released)}) {
		if err != nil {
			t.Fatalf("grant %d of another serial, delivered while serial 1's payment hangs: %v", i, err)
		}
	}
	select {
	case err := <-waiting:
		if !errors.Is(err, settle.ErrBusy) {
			t.Fatalf("the record of serial 1 unpaid, while its payment hangs: %v; want settle.ErrBusy (tried again on its own)", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the record of serial 1 unpaid still waits for the hung payment after 20s")
	}
	if err := hung.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	sinktest.Expect(t, db, []settle.Grant{sinktest.Grant(1, "a", 10, settle.Released)}, settle.ErrPaid)
}

// TestMixedBatchesAtOnce: workers deliver overlapping batches of serials,
// to pay and to settle unpaid in the same batches, at once: no delivery
// fails for the database (a deadlock would: every delivery takes its
// serials in ascending order), and no serial ends up both paid and
// settled unpaid.
func TestMixedBatchesAtOnce(t *testing.T) {
	ctx := context.Background()
	db, _ := open(t)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range 60 {
				var batch []settle.Grant
				for _, s := range r.Perm(120)[:20] {
					why := ""
					if r.IntN(2) == 0 {
						why = settle.Released
					}
					batch = append(batch, sinktest.Grant(int64(s+1), fmt.Sprint("u", s), int64(s+1), why))
				}
				for i, err := range db.Deliver(ctx, batch) {
					if err != nil && !errors.Is(err, settle.ErrPaid) && !errors.Is(err, settle.ErrSettledUnpaid) {
						t.Errorf("worker %d, serial %d: %v", w, batch[i].Serial, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	var both int
	if err := db.pool.QueryRow(ctx, "SELECT count(*) FROM rain_grants g JOIN rain_unpaid u USING (serial)").Scan(&both); err != nil || both != 0 {
		t.Fatalf("%d serials both paid and settled unpaid (%v), want none", both, err)
	}
}
