package postgres

// This file is the accounts of closed pools.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"rain"
)

// Record stores a closed pool's account in rain_pools. The same account
// again (its sums and sub-pools; the time it closed aside: a close resumed
// after a crash computes it anew) is a no-op; another is
// ErrAccountConflict.
func (db *DB) Record(ctx context.Context, a *rain.Account) error {
	subs, err := json.Marshal(a.SubPools)
	if err != nil {
		return err
	}
	_, err = db.pool.Exec(ctx, `INSERT INTO rain_pools (pool_id, preloaded_count, preloaded_cents, confirmed_count, confirmed_cents,
		unclaimed_count, unclaimed_cents, sub_pools, closed_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
		ON CONFLICT (pool_id) DO NOTHING`, a.PoolID, a.PreloadedCount, a.PreloadedCents, a.ConfirmedCount, a.ConfirmedCents,
		a.UnclaimedCount, a.UnclaimedCents, subs, a.ClosedAt)
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	had, err := db.Account(ctx, a.PoolID)
	if err != nil {
		return err
	}
	if !sameAccount(had, a) {
		return fmt.Errorf("%w: pool %s: recorded %+v, now %+v", ErrAccountConflict, a.PoolID, had, a)
	}
	return nil
}

// ErrNoAccount is returned by Account for a pool that has no account.
var ErrNoAccount = errors.New("postgres: no account for the pool")

// Account reads the account of a closed pool.
func (db *DB) Account(ctx context.Context, poolID string) (*rain.Account, error) {
	a := &rain.Account{PoolID: poolID, State: string(rain.Closed)}
	var subs []byte
	err := db.pool.QueryRow(ctx, `SELECT preloaded_count, preloaded_cents, confirmed_count, confirmed_cents,
		unclaimed_count, unclaimed_cents, sub_pools, closed_at FROM rain_pools WHERE pool_id = $1`, poolID).
		Scan(&a.PreloadedCount, &a.PreloadedCents, &a.ConfirmedCount, &a.ConfirmedCents,
			&a.UnclaimedCount, &a.UnclaimedCents, &subs, &a.ClosedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrNoAccount
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := json.Unmarshal(subs, &a.SubPools); err != nil {
		return nil, fmt.Errorf("postgres: account of %s: %w", poolID, err)
	}
	a.ClosedAt = a.ClosedAt.UTC()
	return a, nil
}

// sameAccount compares two accounts' money, sub-pool by sub-pool.
func sameAccount(a, b *rain.Account) bool {
	return a.PoolID == b.PoolID && a.PreloadedCount == b.PreloadedCount && a.PreloadedCents == b.PreloadedCents &&
		a.ConfirmedCount == b.ConfirmedCount && a.ConfirmedCents == b.ConfirmedCents &&
		a.UnclaimedCount == b.UnclaimedCount && a.UnclaimedCents == b.UnclaimedCents &&
		slices.Equal(a.SubPools, b.SubPools)
}
