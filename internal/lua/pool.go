package lua

// This file is setting up and loading a sub-pool, and the pool record.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ErrSpecMismatch is returned by Setup when the sub-pool exists with another
// count or total.
var ErrSpecMismatch = errors.New("lua: sub-pool exists with a different spec")

// Window is a sub-pool's grab rules, in the shard's milliseconds.
type Window struct {
	HoldMS, StartsMS, EndsMS int64 // StartsMS and EndsMS 0 mean none
}

// Setup creates the sub-pool's meta record, or checks the existing one has
// the same count and cents. It returns the sub-pool's state ("loading" or
// "open") and the next batch Load expects.
func Setup(ctx context.Context, c Client, sp SubPool, count, cents int64, w Window) (state string, nextBatch int64, err error) {
	k := sp.Keys()
	res, err := setupScript.Run(ctx, c, []string{k.Meta},
		sp.Pool, sp.Index, count, cents, w.HoldMS, w.StartsMS, w.EndsMS).Slice()
	if err != nil {
		if redis.HasErrorPrefix(err, "RAINSPEC") {
			return "", 0, fmt.Errorf("%w: %s", ErrSpecMismatch, strings.TrimPrefix(err.Error(), "RAINSPEC "))
		}
		return "", 0, fmt.Errorf("setup %s: %w", sp.Tag(), err)
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
)

// LoadCmd queues batch number batch of amounts on pipe; its result is read
// with ParseLoad after the pipeline runs. Batches apply in order, once each,
// so a batch sent again is skipped. The pipeline sends EVALSHA; the caller
// must have loaded the script (see LoadScripts) on the shard first.
func LoadCmd(ctx context.Context, pipe redis.Pipeliner, sp SubPool, batch int64, amounts []int64) *redis.Cmd {
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
// what the stock holds.
func OpenSubPool(ctx context.Context, c Client, sp SubPool) (opened bool, stockCount, stockCents int64, err error) {
	res, err := openScript.Run(ctx, c, []string{sp.Keys().Meta}).Slice()
	if err != nil {
		return false, 0, 0, fmt.Errorf("open %s: %w", sp.Tag(), err)
	}
	if str(res, 0) == "open" {
		return true, 0, 0, nil
	}
	return false, integer(res, 1), integer(res, 2), nil
}

// PutRecord writes a pool record (key recordKey, fields spec, seed,
// placement, state) unless one is there, in one atomic step, and returns
// the stored record's fields.
func PutRecord(ctx context.Context, c Client, key string, fields map[string]string) (map[string]string, error) {
	res, err := recordScript.Run(ctx, c, []string{key},
		fields["spec"], fields["seed"], fields["placement"], fields["state"]).Slice()
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		m[str(res, i)] = str(res, i+1)
	}
	return m, nil
}

// End ends the sub-pool's window now, unless it ended before; it returns
// the end (the shard's clock, ms), or -1 when the sub-pool has no meta
// record (it was never set up).
func End(ctx context.Context, c Client, k *Keys) (int64, error) {
	res, err := endScript.Run(ctx, c, []string{k.Meta}).Slice()
	if err != nil {
		return 0, err
	}
	return integer(res, 0), nil
}

// Sealed is what Seal found of a sub-pool.
type Sealed struct {
	// OK: the sub-pool is sealed (its state "closing"): nothing moves in it
	// any more. Else Reason says why not ("window", "held", "inflight",
	// "unsettled", "missing"), with N of them.
	OK     bool
	Reason string
	N      int64
	// Fresh: this call sealed it (it was open). A close that fails opens
	// again only what it sealed itself, never what a concurrent close did.
	Fresh bool
	// The counters, when sealed.
	Count, Cents, StockCount, StockCents, ConfirmedCount, ConfirmedCents int64
}

// Seal checks the sub-pool can close and seals it (see seal.lua); Unseal
// opens a sealed one again, when the close of another sub-pool failed.
func Seal(ctx context.Context, c Client, k *Keys) (Sealed, error) {
	res, err := sealScript.Run(ctx, c, []string{k.Meta, k.Outbox}, "seal").Slice()
	if err != nil {
		return Sealed{}, err
	}
	switch str(res, 0) {
	case "sealed":
		return Sealed{OK: true, Count: integer(res, 1), Cents: integer(res, 2), StockCount: integer(res, 3),
			StockCents: integer(res, 4), ConfirmedCount: integer(res, 5), ConfirmedCents: integer(res, 6),
			Fresh: integer(res, 7) == 1}, nil
	case "open":
		return Sealed{Reason: str(res, 1), N: integer(res, 2)}, nil
	case "missing":
		return Sealed{Reason: "missing"}, nil
	}
	return Sealed{}, fmt.Errorf("seal: unexpected reply %v", res)
}

// Unseal puts a sealed sub-pool back to open (see Seal).
func Unseal(ctx context.Context, c Client, k *Keys) error {
	return sealScript.Run(ctx, c, []string{k.Meta, k.Outbox}, "unseal").Err()
}
