package postgres

// This file is the grants: delivered in batches by settlement, and what a
// close reconciles.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"rain"
	"rain/internal/settle"
)

// settleLock is the advisory lock (its key) that orders a delivery's
// grants to pay against another's grants to settle unpaid: a transaction
// holds it shared while it pays, and alone while it records grants unpaid,
// so that each sees what the other committed under the same serial (a
// serial is paid, or settled unpaid, never both). Deliveries of grants to
// pay alone, nearly all of them, do not wait for one another. Another
// application's advisory lock under the same key would only make them
// wait.
const settleLock = 0x7261696e00000001 // "rain", 1

// Deliver settles the grants of gs in one transaction: one to pay is
// inserted into rain_grants, one to settle unpaid (settle.Grant.Unpaid)
// into rain_unpaid. A serial the table holds already is a repeat when its
// row is the same grant, and settle.ErrSerialConflict when it is another
// (the row stays as it was). A grant to pay whose serial rain_unpaid
// holds is settle.ErrSettledUnpaid, and a grant to settle unpaid whose
// serial rain_grants holds settle.ErrPaid: nothing changes for either
// (settle.RecordsUnpaid). Within gs, a serial met again is a repeat of its
// first grant when the same (and settled the same way), and
// settle.ErrSerialConflict when not: the first is settled (or compared
// with the table's row), the other never counted delivered. An error of
// the database is every grant's: none was acknowledged, and settlement
// delivers them again.
func (db *DB) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = fmt.Errorf("postgres: %w", err)
		}
		return errs
	}
	first := make(map[int64]int, len(gs)) // serial -> the index of its first grant in gs
	var pay, unpaid []int64               // serials, each once
	for i, g := range gs {
		if f, ok := first[g.Serial]; ok {
			if !gs[f].Same(g) || (gs[f].Unpaid == "") != (g.Unpaid == "") {
				errs[i] = fmt.Errorf("%w: serial %d is %s in this batch, and %s", settle.ErrSerialConflict, g.Serial, gs[f], g)
			}
			continue
		}
		first[g.Serial] = i
		if g.Unpaid == "" {
			pay = append(pay, g.Serial)
		} else {
			unpaid = append(unpaid, g.Serial)
		}
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	lock := "SELECT pg_advisory_xact_lock_shared($1)"
	if len(unpaid) > 0 {
		lock = "SELECT pg_advisory_xact_lock($1)"
	}
	if _, err := tx.Exec(ctx, lock, int64(settleLock)); err != nil {
		return fail(err)
	}
	// A serial settled the other way is not settled again.
	for _, other := range []struct {
		serials []int64
		table   string
		err     error
	}{{pay, "rain_unpaid", settle.ErrSettledUnpaid}, {unpaid, "rain_grants", settle.ErrPaid}} {
		held, err := rowsOf(ctx, tx, other.table, other.serials)
		if err != nil {
			return fail(err)
		}
		for s, had := range held {
			i := first[s]
			errs[i] = fmt.Errorf("%w: serial %d is %s in %s, now %s", other.err, s, had, other.table, gs[i])
		}
	}
	for _, t := range []struct {
		serials []int64
		table   string
	}{{pay, "rain_grants"}, {unpaid, "rain_unpaid"}} {
		var rows []settle.Grant
		for _, s := range t.serials {
			if i := first[s]; errs[i] == nil {
				rows = append(rows, gs[i])
			}
		}
		held, err := insert(ctx, tx, t.table, rows)
		if err != nil {
			return fail(err)
		}
		for s, had := range held {
			if i := first[s]; !had.Same(gs[i]) {
				errs[i] = fmt.Errorf("%w: serial %d is %s in %s, now %s", settle.ErrSerialConflict, s, had, t.table, gs[i])
			}
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
// returns the rows it held of those serials.
func insert(ctx context.Context, tx pgx.Tx, table string, gs []settle.Grant) (held map[int64]settle.Grant, err error) {
	if len(gs) == 0 {
		return nil, nil
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
		return nil, err
	}
	inserted := map[int64]bool{}
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return nil, err
		}
		inserted[s] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var again []int64
	for _, s := range serials {
		if !inserted[s] {
			again = append(again, s)
		}
	}
	return rowsOf(ctx, tx, table, again)
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
