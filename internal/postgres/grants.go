package postgres

// This file is the grants: delivered in batches by settlement, and what a
// close reconciles.

import (
	"context"
	"fmt"
	"time"

	"rain"
	"rain/internal/settle"
)

// Deliver inserts the grants of gs in one transaction; a serial the table
// holds already is a repeat when its row is the same grant, and
// settle.ErrSerialConflict when it is another (the row stays as it was).
// Within gs, a serial met again is a repeat of its first grant when the
// same, and settle.ErrSerialConflict when another: the first is inserted
// (or compared with the table's row), the other never counted delivered.
// An error of the database is every grant's: none was acknowledged, and
// settlement delivers them again.
func (db *DB) Deliver(ctx context.Context, gs []settle.Grant) []error {
	errs := make([]error, len(gs))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = fmt.Errorf("postgres: %w", err)
		}
		return errs
	}
	first := make(map[int64]int, len(gs)) // serial -> the index of its first grant in gs
	var serials []int64
	var pools, users []string
	var subs []int32
	var amounts []int64
	var at []time.Time
	for i, g := range gs {
		if f, ok := first[g.Serial]; ok {
			if !gs[f].Same(g) {
				errs[i] = fmt.Errorf("%w: serial %d is %s in this batch, and %s", settle.ErrSerialConflict, g.Serial, gs[f], g)
			}
			continue
		}
		first[g.Serial] = i
		serials, pools, subs = append(serials, g.Serial), append(pools, g.PoolID), append(subs, int32(g.SubPool))
		users, amounts, at = append(users, g.UserID), append(amounts, g.AmountCents), append(at, g.GrantedAt)
	}
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(ctx) // a no-op after Commit
	rows, err := tx.Query(ctx, `INSERT INTO rain_grants (serial, pool_id, sub_pool, user_id, amount_cents, granted_at)
		SELECT * FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::timestamptz[])
		ON CONFLICT (serial) DO NOTHING RETURNING serial`, serials, pools, subs, users, amounts, at)
	if err != nil {
		return fail(err)
	}
	inserted := map[int64]bool{}
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return fail(err)
		}
		inserted[s] = true
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	var again []int64
	for _, s := range serials {
		if !inserted[s] {
			again = append(again, s)
		}
	}
	held := map[int64]settle.Grant{}
	if len(again) > 0 {
		rows, err := tx.Query(ctx, "SELECT serial, pool_id, sub_pool, user_id, amount_cents FROM rain_grants WHERE serial = ANY($1)", again)
		if err != nil {
			return fail(err)
		}
		for rows.Next() {
			var g settle.Grant
			if err := rows.Scan(&g.Serial, &g.PoolID, &g.SubPool, &g.UserID, &g.AmountCents); err != nil {
				rows.Close()
				return fail(err)
			}
			held[g.Serial] = g
		}
		if err := rows.Err(); err != nil {
			return fail(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	for i, g := range gs {
		if errs[i] != nil {
			continue // another grant of this batch under its serial
		}
		if had, ok := held[g.Serial]; ok && !inserted[g.Serial] && !had.Same(g) {
			errs[i] = fmt.Errorf("%w: serial %d is %s in the database, now %s", settle.ErrSerialConflict, g.Serial, had, g)
		}
	}
	// A repeat within the batch shares its first grant's fate.
	for i, g := range gs {
		if f := first[g.Serial]; f != i && errs[i] == nil {
			errs[i] = errs[f]
		}
	}
	return errs
}

// Serials returns the serials of the grants the database holds of the
// user in the pool: the grants settlement delivered, each confirmed (at
// most one in practice: a user holds one grant of a pool at a time, and
// one released at its deadline was never confirmed).
func (db *DB) Serials(ctx context.Context, poolID, userID string) ([]int64, error) {
	rows, err := db.pool.Query(ctx, `SELECT serial FROM rain_grants WHERE pool_id = $1 AND user_id = $2`, poolID, userID)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var s int64
		if err := rows.Scan(&s); err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return out, nil
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
