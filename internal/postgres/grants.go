package postgres

// This file is the grants: delivered in batches by settlement, and what a
// close reconciles.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"rain"
	"rain/internal/settle"
)

// lockTimeout bounds a delivery's wait for a serial another transaction
// holds, and idleInTransaction how long the server keeps a delivery's
// transaction whose client went quiet (Deliver).
const (
	lockTimeout       = "2s"
	idleInTransaction = "60s"
)

// lockNotAvailable is PostgreSQL's SQLSTATE for a lock not had within
// lock_timeout.
const lockNotAvailable = "55P03"

// Deliver settles the grants of gs in one transaction: one to pay is
// inserted into rain_grants, one to settle unpaid (settle.Grant.Unpaid)
// into rain_unpaid. A serial the table holds already is a repeat when its
// row is the same grant, and settle.ErrSerialConflict when it is another
// (the row stays as it was). A grant to pay whose serial rain_unpaid holds
// is settle.ErrSettledUnpaid, and a grant to settle unpaid whose serial
// rain_grants holds settle.ErrPaid, each when the row is the same grant
// (settle.ErrSerialConflict when another): nothing changes for either
// (settle.RecordsUnpaid). Within gs, a serial met again is a repeat of its
// first grant when the same (and settled the same way), and
// settle.ErrSerialConflict when not: the first is settled (or compared
// with the tables' rows), the other never counted delivered. An error of
// the database is every grant's: none was acknowledged, and settlement
// delivers them again.
//
// Paying a serial and recording it unpaid exclude each other through
// rain_grants' primary key alone, serial by serial, at READ COMMITTED
// (set here, whatever the database's default): a grant to settle unpaid
// is first inserted into rain_grants too, and that row deleted again
// before the transaction ends. That insert waits for a payment of the
// serial in flight, and finds it once committed (ErrPaid); a payment's
// insert waits for such a transaction in flight, and its next statement,
// which reads rain_unpaid, then sees what it recorded (ErrSettledUnpaid,
// and the payment's row is deleted). A delivery waits at most lockTimeout
// for a serial another holds, and fails then (settle.ErrBusy: tried again
// later, each grant on its own); a delivery's session whose client is gone
// is ended by the server, so a transaction that hangs holds up only the
// serials it holds, and for a while.
func (db *DB) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	fail := func(err error) []error {
		if pe := (*pgconn.PgError)(nil); errors.As(err, &pe) && pe.Code == lockNotAvailable {
			err = fmt.Errorf("%w (%w)", settle.ErrBusy, err) // lockTimeout ran out
		}
		for i := range errs {
			errs[i] = fmt.Errorf("postgres: %w", err)
		}
		return errs
	}
	first := make(map[int64]int, len(gs)) // serial -> the index of its first grant in gs
	var pay, unpaid []settle.Grant        // first grants, each serial once
	for i, g := range gs {
		if f, ok := first[g.Serial]; ok {
			if !gs[f].Same(g) || (gs[f].Unpaid == "") != (g.Unpaid == "") {
				errs[i] = fmt.Errorf("%w: serial %d is %s in this batch, and %s", settle.ErrSerialConflict, g.Serial, gs[f], g)
			}
			continue
		}
		first[g.Serial] = i
		if g.Unpaid == "" {
			pay = append(pay, g)
		} else {
			unpaid = append(unpaid, g)
		}
	}
	tx, err := db.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	// A serial another transaction holds (a delivery of it in flight, or
	// one whose client is gone, until the server ends it) is waited for
	// this long at most: then the batch fails, and settlement delivers it
	// again later, so that one held serial never keeps a connection.
	// And a session whose client is gone (a host lost mid-delivery) keeps
	// it open no longer than idleInTransaction: the server ends it.
	// (A database or role that ends idle transactions sooner keeps that.)
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'; "+
		"SELECT set_config('idle_in_transaction_session_timeout', '"+idleInTransaction+"', true) "+
		"WHERE current_setting('idle_in_transaction_session_timeout')::interval NOT BETWEEN '1 ms' AND '"+idleInTransaction+"'"); err != nil {
		return fail(err)
	}
	// refuse answers for the grant under serial s that the row had holds
	// it: why when the same grant, settle.ErrSerialConflict when another.
	refuse := func(s int64, had settle.Grant, table string, why error) {
		i := first[s]
		if !had.Same(gs[i]) {
			why = settle.ErrSerialConflict
		}
		errs[i] = fmt.Errorf("%w: serial %d is %s in %s, now %s", why, s, had, table, gs[i])
	}
	// gone answers for the grants of in that table neither took (added)
	// nor held (held): a row deleted between the two statements (by hand).
	// Nothing is settled; they are delivered again.
	gone := func(in []settle.Grant, added []int64, held map[int64]settle.Grant, table string) {
		took := make(map[int64]bool, len(added))
		for _, s := range added {
			took[s] = true
		}
		for _, g := range in {
			if _, ok := held[g.Serial]; !ok && !took[g.Serial] {
				errs[first[g.Serial]] = fmt.Errorf("postgres: serial %d was in %s and is gone: delivered again", g.Serial, table)
			}
		}
	}
	// Every serial of gs taken in rain_grants, in one statement and in
	// ascending order (so that two deliveries wait for each other in one
	// order, never in a cycle): those to pay for good, those to settle
	// unpaid until their row is deleted below.
	all := append(pay, unpaid...)
	slices.SortFunc(all, func(a, b settle.Grant) int { return cmp.Compare(a.Serial, b.Serial) })
	added, held, err := insert(ctx, tx, "rain_grants", all)
	if err != nil {
		return fail(err)
	}
	for s, had := range held {
		if gs[first[s]].Unpaid != "" {
			refuse(s, had, "rain_grants", settle.ErrPaid)
		} else if !had.Same(gs[first[s]]) {
			refuse(s, had, "rain_grants", settle.ErrSerialConflict)
		}
	}
	gone(all, added, held, "rain_grants")
	var paying, taken []int64
	for _, s := range added {
		if gs[first[s]].Unpaid == "" {
			paying = append(paying, s)
		} else {
			taken = append(taken, s)
		}
	}
	// A grant to pay whose serial was recorded unpaid is not paid.
	recorded, err := rowsOf(ctx, tx, "rain_unpaid", paying)
	if err != nil {
		return fail(err)
	}
	undo := taken
	for s, had := range recorded {
		refuse(s, had, "rain_unpaid", settle.ErrSettledUnpaid)
		undo = append(undo, s)
	}
	if len(undo) > 0 {
		if _, err := tx.Exec(ctx, "DELETE FROM rain_grants WHERE serial = ANY($1)", undo); err != nil {
			return fail(err)
		}
	}
	// The grants to settle unpaid whose serials were taken, recorded.
	var rows []settle.Grant
	for _, s := range taken {
		rows = append(rows, gs[first[s]])
	}
	recordedNow, had, err := insert(ctx, tx, "rain_unpaid", rows)
	if err != nil {
		return fail(err)
	}
	gone(rows, recordedNow, had, "rain_unpaid")
	for s, h := range had {
		if !h.Same(gs[first[s]]) {
			refuse(s, h, "rain_unpaid", settle.ErrSerialConflict)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	// A repeat within the batch shares its first grant's fate.
	for i, g := range gs {
		if f := first[g.Serial]; f != i && errs[i] == nil {
			errs[i] = errs[f]
		}
	}
	return errs
}

// insert inserts gs into table (rain_grants, or rain_unpaid with each
// grant's reason), a serial the table holds already left as it is, and
// returns the serials it inserted and the rows the table held of the
// others.
func insert(ctx context.Context, tx pgx.Tx, table string, gs []settle.Grant) (added []int64, held map[int64]settle.Grant, err error) {
	if len(gs) == 0 {
		return nil, nil, nil
	}
	serials, pools, subs := make([]int64, len(gs)), make([]string, len(gs)), make([]int32, len(gs))
	users, amounts, at, reasons := make([]string, len(gs)), make([]int64, len(gs)), make([]time.Time, len(gs)), make([]string, len(gs))
	for i, g := range gs {
		serials[i], pools[i], subs[i], users[i], amounts[i], at[i], reasons[i] = g.Serial, g.PoolID, int32(g.SubPool), g.UserID, g.AmountCents, g.GrantedAt, g.Unpaid
	}
	q := `INSERT INTO rain_grants (serial, pool_id, sub_pool, user_id, amount_cents, granted_at)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::timestamptz[])
		ON CONFLICT (serial) DO NOTHING RETURNING serial`
	args := []any{serials, pools, subs, users, amounts, at}
	if table == "rain_unpaid" {
		q = `INSERT INTO rain_unpaid (serial, pool_id, sub_pool, user_id, amount_cents, granted_at, reason)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::timestamptz[], $7::text[])
		ON CONFLICT (serial) DO NOTHING RETURNING serial`
		args = append(args, reasons)
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, nil, err
	}
	inserted := map[int64]bool{}
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, nil, err
		}
		inserted[s] = true
		added = append(added, s)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	var again []int64
	for _, s := range serials {
		if !inserted[s] {
			again = append(again, s)
		}
	}
	held, err = rowsOf(ctx, tx, table, again)
	return added, held, err
}

// rowsOf reads the grants table holds under serials.
func rowsOf(ctx context.Context, tx pgx.Tx, table string, serials []int64) (map[int64]settle.Grant, error) {
	if len(serials) == 0 {
		return nil, nil
	}
	// table is one of two constants: never outside input.
	rows, err := tx.Query(ctx, "SELECT serial, pool_id, sub_pool, user_id, amount_cents FROM "+table+" WHERE serial = ANY($1)", serials)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	held := map[int64]settle.Grant{}
	for rows.Next() {
		var g settle.Grant
		if err := rows.Scan(&g.Serial, &g.PoolID, &g.SubPool, &g.UserID, &g.AmountCents); err != nil {
			return nil, err
		}
		held[g.Serial] = g
	}
	return held, rows.Err()
}

// RecordsUnpaid reports that the database records the grants settled
// unpaid (rain_unpaid): settle.RecordsUnpaid.
func (db *DB) RecordsUnpaid() bool { return true }

// Settled returns the serials of the user's grants in the pool that the
// database holds: those settlement delivered (paid), each confirmed, and
// those it recorded as released at their deadline, unconfirmed (at most
// one grant in practice: a user holds one grant of a pool at a time).
func (db *DB) Settled(ctx context.Context, poolID, userID string) (paid, released []int64, err error) {
	rows, err := db.pool.Query(ctx, `SELECT serial, false FROM rain_grants WHERE pool_id = $1 AND user_id = $2
		UNION ALL SELECT serial, true FROM rain_unpaid WHERE pool_id = $1 AND user_id = $2 AND reason = 'released'`, poolID, userID)
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s int64
		var rel bool
		if err := rows.Scan(&s, &rel); err != nil {
			return nil, nil, fmt.Errorf("postgres: %w", err)
		}
		if rel {
			released = append(released, s)
		} else {
			paid = append(paid, s)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	return paid, released, nil
}

// Totals returns the grants the database holds of the pool, by sub-pool.
func (db *DB) Totals(ctx context.Context, poolID string) (map[int]rain.Tally, error) {
	rows, err := db.pool.Query(ctx, `SELECT sub_pool, count(*), coalesce(sum(amount_cents), 0)
		FROM rain_grants WHERE pool_id = $1 GROUP BY sub_pool`, poolID)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer rows.Close()
	out := map[int]rain.Tally{}
	for rows.Next() {
		var j int
		var t rain.Tally
		if err := rows.Scan(&j, &t.Count, &t.Cents); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		out[j] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return out, nil
}
