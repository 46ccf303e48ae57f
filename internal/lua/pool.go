package lua

// This file is setting up and loading a sub-pool, and the pool record.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
)

// Errors of the steps that set up and load a sub-pool.
var (
	// ErrSpecMismatch is returned by Setup when the sub-pool exists with
	// another count or total.
	ErrSpecMismatch = errors.New("lua: sub-pool exists with a different spec")
	// ErrClosed is returned by Setup and OpenSubPool when the sub-pool's
	// pool was closed (or is closing): nothing was written, and nothing
	// ever will be (a preload that stalled past the close).
	ErrClosed = errors.New("lua: sub-pool closed")
)

// Window is a sub-pool's grab rules, in the shard's milliseconds.
type Window struct {
	HoldMS, StartsMS, EndsMS int64 // StartsMS and EndsMS 0 mean none
}

// Setup creates the sub-pool's meta record, or checks the existing one has
// the same count and cents. It returns the sub-pool's state ("loading" or
// "open") and the next batch Load expects; ErrClosed for a sub-pool whose
// pool closed.
func Setup(ctx context.Context, c Client, sp rain.SubPool, count, cents int64, w Window) (state string, nextBatch int64, err error) {
	k := sp.Keys()
	res, err := setupScript.Run(ctx, c, []string{k.Meta},
		sp.Pool, sp.Index, count, cents, w.HoldMS, w.StartsMS, w.EndsMS).Slice()
	if err != nil {
		if redis.HasErrorPrefix(err, "RAINSPEC") {
			return "", 0, fmt.Errorf("%w: %s", ErrSpecMismatch, strings.TrimPrefix(err.Error(), "RAINSPEC "))
		}
		return "", 0, fmt.Errorf("setup %s: %w", sp.Tag(), err)
	}
	if str(res, 0) == "closed" {
		return "", 0, fmt.Errorf("setup %s: %w", sp.Tag(), ErrClosed)
	}
	return str(res, 0), integer(res, 1), nil
}

// LoadResult says what Load did with a batch.
type LoadResult string

// Load results.
const (
	Loaded      LoadResult = "loaded"  // appended
	Skipped     LoadResult = "skipped" // not the next batch: already in, or out of order
	AlreadyOpen LoadResult = "open"    // the sub-pool is open; nothing appended
	LoadClosed  LoadResult = "closed"  // its pool closed; nothing appended, ever
)

// LoadCmd queues batch number batch of amounts on pipe; its result is read
// with ParseLoad after the pipeline runs. Batches apply in order, once each,
// so a batch sent again is skipped. The pipeline sends EVALSHA; the caller
// must have loaded the script (see LoadScripts) on the shard first.
func LoadCmd(ctx context.Context, pipe redis.Pipeliner, sp rain.SubPool, batch int64, amounts []int64) *redis.Cmd {
	k := sp.Keys()
	args := make([]any, 0, len(amounts)+1)
	args = append(args, batch)
	for _, a := range amounts {
		args = append(args, a)
	}
	return loadScript.EvalSha(ctx, pipe, []string{k.Meta, k.Stock}, args...)
}

// ParseLoad reads the result of a LoadCmd.
func ParseLoad(cmd *redis.Cmd) (LoadResult, int64, error) {
	res, err := cmd.Slice()
	if err != nil {
		return "", 0, err
	}
	return LoadResult(str(res, 0)), integer(res, 1), nil
}

// OpenSubPool opens the sub-pool if its stock is complete; if not, it says
// what the stock holds. ErrClosed for a sub-pool sealed or closed by its
// pool's close: it never opens again.
func OpenSubPool(ctx context.Context, c Client, sp rain.SubPool) (opened bool, stockCount, stockCents int64, err error) {
	res, err := openScript.Run(ctx, c, []string{sp.Keys().Meta}).Slice()
	if err != nil {
		return false, 0, 0, fmt.Errorf("open %s: %w", sp.Tag(), err)
	}
	switch str(res, 0) {
	case "open":
		return true, 0, 0, nil
	case "closed":
		return false, 0, 0, fmt.Errorf("open %s: %w", sp.Tag(), ErrClosed)
	}
	return false, integer(res, 1), integer(res, 2), nil
}

// PutRecord writes a pool record (key recordKey; fields spec, seed,
// placement, state and, when not empty, account) where none is whole, or
// moves a record of the same pool on to fields["state"] (with the account)
// when it is at an earlier stage of the pool's life; never back (see
// record.lua). It returns the stored record's fields, and whether this
// call wrote the record or moved it on (of concurrent calls, one; a call
// re-sent after its reply was lost finds it moved already, and says no).
func PutRecord(ctx context.Context, c Client, key string, fields map[string]string) (map[string]string, bool, error) {
	res, err := recordScript.Run(ctx, c, []string{key},
		fields["spec"], fields["seed"], fields["placement"], fields["state"], fields["account"], fields["tags"]).Slice()
	if err != nil {
		return nil, false, err
	}
	if len(res)%2 != 1 {
		return nil, false, fmt.Errorf("record: a reply of %d values, want the record's pairs and a flag", len(res))
	}
	m := make(map[string]string, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		m[str(res, i)] = str(res, i+1)
	}
	return m, integer(res, len(res)-1) == 1, nil
}

// End ends the sub-pool's window now, unless it ended before; it returns
// the end (the shard's clock, ms), or -1 when the sub-pool has no meta
// record (it was never set up).
func End(ctx context.Context, c Client, k *rain.Keys) (int64, error) {
	res, err := endScript.Run(ctx, c, []string{k.Meta}).Slice()
	if err != nil {
		return 0, err
	}
	return integer(res, 0), nil
}

// Sealed is what Seal found of a sub-pool.
type Sealed struct {
	// OK: the sub-pool is sealed (its state "closing") by this owner:
	// nothing moves in it any more. Else Reason says why not ("window",
	// "held", "inflight", "unsettled", "closed", "missing"), with N of
	// them; "sealing": another owner sealed it, its lease has N ms left.
	OK     bool
	Reason string
	N      int64
	// The counters, when sealed.
	Count, Cents, StockCount, StockCents, ConfirmedCount, ConfirmedCents int64
}

// Seal checks the sub-pool can close and seals it for owner, a token of the
// caller's own (see seal.lua): a seal belongs to its owner for lease (a
// seal whose lease ran out passes to the next owner that asks: its close
// died). Sealing again for the same owner answers as the first time.
func Seal(ctx context.Context, c Client, k *rain.Keys, owner string, lease time.Duration) (Sealed, error) {
	res, err := sealScript.Run(ctx, c, []string{k.Meta, k.Outbox}, "seal", owner, lease.Milliseconds()).Slice()
	if err != nil {
		return Sealed{}, err
	}
	switch str(res, 0) {
	case "sealed":
		return Sealed{OK: true, Count: integer(res, 1), Cents: integer(res, 2), StockCount: integer(res, 3),
			StockCents: integer(res, 4), ConfirmedCount: integer(res, 5), ConfirmedCents: integer(res, 6)}, nil
	case "open":
		return Sealed{Reason: str(res, 1), N: integer(res, 2)}, nil
	case "missing":
		return Sealed{Reason: "missing"}, nil
	}
	return Sealed{}, fmt.Errorf("seal: unexpected reply %v", res)
}

// Unseal puts a sub-pool that owner sealed back to open, when the close of
// another sub-pool failed; a seal of another owner is kept (unsealed
// false).
func Unseal(ctx context.Context, c Client, k *rain.Keys, owner string) (unsealed bool, err error) {
	res, err := sealScript.Run(ctx, c, []string{k.Meta, k.Outbox}, "unseal", owner, 0).Slice()
	if err != nil {
		return false, err
	}
	return str(res, 0) == "unsealed", nil
}

// Retire frees every key of a sealed sub-pool and leaves its tombstone, a
// meta of state "closed" that every script reads before it writes (see
// retire.lua). It refuses (ok false, with the state found) a sub-pool that
// is neither sealed nor unable to move. Retiring again changes nothing.
func Retire(ctx context.Context, c Client, sp rain.SubPool) (ok bool, state string, err error) {
	res, err := retireScript.Run(ctx, c, sp.Keys().All(), sp.Pool, sp.Index).Slice()
	if err != nil {
		return false, "", err
	}
	return str(res, 0) == "retired", str(res, 1), nil
}
