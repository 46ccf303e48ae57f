package postgres

// This file is the grants: delivered in batches by settlement, and what a
// close reconciles.

import (
	"context"
	"fmt"
	"time"

	"rain/internal/catalog"
	"rain/internal/settle"
)

// Deliver inserts the grants of gs in one transaction; a serial the table
// holds already is a repeat when its row is the same grant, and
// settle.ErrSerialConflict when it is another (the row stays as it was).
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
	serials := make([]int64, len(gs))
	pools, users := make([]string, len(gs)), make([]string, len(gs))
	subs := make([]int32, len(gs))
	amounts := make([]int64, len(gs))
	at := make([]time.Time, len(gs))
	for i, g := range gs {
		serials[i], pools[i], subs[i], users[i], amounts[i], at[i] = g.Serial, g.PoolID, int32(g.SubPool), g.UserID, g.AmountCents, g.GrantedAt
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
		if had, ok := held[g.Serial]; ok && !inserted[g.Serial] && !had.Same(g) {
			errs[i] = fmt.Errorf("%w: serial %d is %s in the database, now %s", settle.ErrSerialConflict, g.Serial, had, g)
		}
	}
	return errs
}

// Totals returns the grants the database holds of the pool, by sub-pool.
func (db *DB) Totals(ctx context.Context, poolID string) (map[int]catalog.Tally, error) {
	rows, err := db.pool.Query(ctx, `SELECT sub_pool, count(*), coalesce(sum(amount_cents), 0)
		FROM rain_grants WHERE pool_id = $1 GROUP BY sub_pool`, poolID)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	defer rows.Close()
	out := map[int]catalog.Tally{}
	for rows.Next() {
		var j int
		var t catalog.Tally
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
