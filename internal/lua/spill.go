package lua

// This file is the spill protocol's steps: take, adopt, decide, abort, and
// the last one, at the sibling, that resolves a transfer by the home's
// verdict (ack or untake); and the reaper's view of transfers in flight. The protocol
// is told in docs/architecture.md#the-spill-protocol.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"rain"
)

// SpillValidity is how long a spill's reservation lasts (T): claim_many and
// adopt refuse a reservation older than this, and the reaper drops it. Every
// rain process must use the same; tests shorten it.
const SpillValidity = 3 * time.Second

// Taken is what a take did.
type Taken uint8

// Take results.
const (
	TakenAmount  Taken = iota + 1 // the amount is in flight under the token
	TakeEmpty                     // the sub-pool has no stock
	TakeResolved                  // the token's transfer was resolved (acked or untaken) already
	TakeConflict                  // the token is stored for another user or home
	TakeEnded                     // the sub-pool's window has ended, or its pool's close sealed it: nothing is taken
)

// ErrNotReplicated is returned by a step run with a replica wait (wait >
// 0) when no replica acknowledged it in time: it ran on the primary, and a
// failover now could lose it.
var ErrNotReplicated = errors.New("lua: no replica acknowledged the step in time")

// Pipeliner is a Client that pipelines (*redis.Client does): a step and
// the WAIT after it go on one connection.
type Pipeliner interface {
	Client
	Pipeline() redis.Pipeliner
}

// runWait runs script s on c and, when wait > 0, WAIT 1 (bounded by wait)
// after it on the same connection: WAIT counts the replicas that have this
// connection's writes, so a WAIT on another connection proves nothing. A
// shard whose script cache is empty answers NOSCRIPT (nothing ran): the
// script is loaded and the step sent again.
func runWait(ctx context.Context, c Pipeliner, s *redis.Script, keys []string, wait time.Duration, args ...any) ([]any, error) {
	if wait <= 0 {
		return s.Run(ctx, c, keys, args...).Slice()
	}
	for try := 0; ; try++ {
		pipe := c.Pipeline()
		cmd := s.EvalSha(ctx, pipe, keys, args...)
		w := redis.NewIntCmd(ctx, "wait", 1, wait.Milliseconds())
		_ = pipe.Process(ctx, w)
		_, _ = pipe.Exec(ctx) // errors are per command, read below
		if IsNoScript(cmd.Err()) && try == 0 {
			if err := s.Load(ctx, c).Err(); err != nil {
				return nil, err
			}
			continue
		}
		res, err := cmd.Slice()
		if err != nil {
			return nil, err
		}
		if n, werr := w.Result(); werr != nil || n < 1 {
			return res, fmt.Errorf("%w (WAIT answered %d, %v)", ErrNotReplicated, n, werr)
		}
		return res, nil
	}
}

// fenceArg is the fence argument of a step run with a replica wait of wait.
func fenceArg(wait time.Duration) string { return fenceFlag(wait > 0) }

// fenceFlag is a script's fence argument: "1" when the caller WAITs for a
// replica after the script on the same connection (see claim_many.lua).
func fenceFlag(on bool) string {
	if on {
		return "1"
	}
	return "0"
}

// Take moves one amount of sibling sub-pool k into an in-flight transfer
// for user, whose home sub-pool is home. Taking again with a token returns
// the same transfer, as long as it is in flight. With wait > 0 (a shard
// with replicas) a replica must have the take within wait, else
// ErrNotReplicated (the take may be in flight: refuse the token at home).
func Take(ctx context.Context, c Pipeliner, k *rain.Keys, token string, home int, user string, wait time.Duration) (Taken, int64, error) {
	res, err := runWait(ctx, c, takeScript, []string{k.Meta, k.Stock, k.Transfers, k.Resolved}, wait, token, home, user, fenceArg(wait))
	if err != nil {
		return 0, 0, err
	}
	switch str(res, 0) {
	case "taken":
		return TakenAmount, integer(res, 1), nil
	case "empty":
		return TakeEmpty, 0, nil
	case "ended", "closed": // closed: sealed or retired by its pool's close, which ended it
		return TakeEnded, 0, nil
	case "settled":
		return TakeResolved, 0, nil
	case "conflict":
		return TakeConflict, 0, nil
	}
	return 0, 0, fmt.Errorf("take: unexpected reply %v", res)
}

// Adopt turns user's reservation at home (keys k) into a held grant of
// amount from sibling origin, if the home's window has not ended, the
// reservation still carries token and is younger than validityMS and the
// user holds no grant; else it records the token as refused and ok is
// false, with the claim Ended when the home's window has ended. Sent again,
// it answers as the first run did. With wait > 0, a replica must have it
// within wait, else ErrNotReplicated (its outcome is not known: ask Decide).
func Adopt(ctx context.Context, c Pipeliner, k *rain.Keys, user, token string, serial, amount int64, origin int, validityMS int64, wait time.Duration) (Claim, bool, error) {
	res, err := runWait(ctx, c, adoptScript, []string{k.Meta, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Verdicts}, wait,
		user, token, serial, amount, origin, validityMS, fenceArg(wait))
	if err != nil {
		return Claim{}, false, err
	}
	switch str(res, 0) {
	case "ended":
		return Claim{Outcome: Ended}, false, nil
	case "stale":
		return Claim{}, false, nil
	case "granted":
	default:
		return Claim{}, false, fmt.Errorf("adopt: unexpected reply %v", res)
	}
	return Claim{Outcome: Granted, Amount: integer(res, 1), Serial: integer(res, 2), DeadlineMS: integer(res, 3)}, true, nil
}

// Verdict is the home's decision on a spill token.
type Verdict struct {
	Adopted    bool  // else refused
	Origin     int   // the sibling it was adopted from
	Amount     int64 // the amount adopted
	DeadlineMS int64 // the grant's deadline
}

// Decide returns the home's verdict on token, refusing it for good if the
// home has not decided it yet. The sibling acks a transfer only if the
// verdict is adopted from it with its amount, and untakes it otherwise.
// With wait > 0, a replica must have the verdict within wait, else
// ErrNotReplicated.
func Decide(ctx context.Context, c Pipeliner, k *rain.Keys, token, user string, wait time.Duration) (Verdict, error) {
	res, err := runWait(ctx, c, decideScript, []string{k.Meta, k.Reserve, k.Verdicts}, wait, token, user, fenceArg(wait))
	if err != nil {
		return Verdict{}, err
	}
	switch str(res, 0) {
	case "adopted":
		return Verdict{Adopted: true, Origin: int(integer(res, 1)), Amount: integer(res, 2), DeadlineMS: integer(res, 3)}, nil
	case "refused":
		return Verdict{}, nil
	}
	return Verdict{}, fmt.Errorf("decide: unexpected reply %v", res)
}

// Resolution is what an ack or an untake did: the last step of a spill,
// at the sibling, resolves its transfer by the home's verdict.
type Resolution uint8

// Ack and Untake results.
const (
	Acked           Resolution = iota + 1 // the transfer is sent (granted at its home)
	Returned                              // the amount is back in the stock
	NoTransfer                            // no transfer under the token
	ResolveConflict                       // resolved the other way already
)

// Ack marks a transfer the home adopted as sent; Untake puts one the home
// refused back in the stock. Either resolves the transfer: it moves from
// the transfers in flight to the resolved ones (Keys.Resolved). Both are
// idempotent: sent again, each answers as the first run did.
func Ack(ctx context.Context, c Client, k *rain.Keys, token string) (Resolution, error) {
	return resolveTransfer(ctx, c, k, token, "ack")
}

// Untake: see Ack.
func Untake(ctx context.Context, c Client, k *rain.Keys, token string) (Resolution, error) {
	return resolveTransfer(ctx, c, k, token, "untake")
}

func resolveTransfer(ctx context.Context, c Client, k *rain.Keys, token, op string) (Resolution, error) {
	res, err := ackScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Transfers, k.Resolved}, token, op).Slice()
	if err != nil {
		return 0, err
	}
	switch str(res, 0) {
	case "acked":
		return Acked, nil
	case "returned":
		return Returned, nil
	case "gone":
		return NoTransfer, nil
	case "conflict":
		return ResolveConflict, nil
	}
	return 0, fmt.Errorf("%s: unexpected reply %v", op, res)
}

// Abort drops user's reservation at home if it still carries the token,
// and with refuse records the token as refused (a take under it may have
// run): a late adopt of it never grants. Without refuse (nothing was
// taken under the token) nothing is recorded. adopted is true when the
// home had adopted the token already: then there is nothing to abort.
func Abort(ctx context.Context, c Client, k *rain.Keys, user, token string, refuse bool) (adopted bool, err error) {
	mode := "drop"
	if refuse {
		mode = "refuse"
	}
	res, err := abortScript.Run(ctx, c, []string{k.Meta, k.Reserve, k.Verdicts}, user, token, mode).Slice()
	if err != nil {
		return false, err
	}
	return str(res, 0) == "adopted", nil
}

// StaleTransfer is a transfer out of a sub-pool in flight long enough to
// resolve.
type StaleTransfer struct {
	Token  string
	Home   int
	User   string
	Amount int64
}

// InFlight is what StaleTransfers found of a sub-pool's transfers out.
type InFlight struct {
	Stale []StaleTransfer // in flight for longer than the age
	// NextMS is how long until one can next be; Count how many are in
	// flight, stale or not.
	NextMS, Count int64
}

// StaleTransfers drops the sub-pool's reservations older than validityMS and
// lists its transfers in flight for more than ageMS.
func StaleTransfers(ctx context.Context, c Client, k *rain.Keys, validityMS, ageMS int64) (InFlight, error) {
	res, err := transfersScript.Run(ctx, c, []string{k.Reserve, k.Transfers}, validityMS, ageMS).Slice()
	if err != nil {
		return InFlight{}, err
	}
	f := InFlight{NextMS: integer(res, 1), Count: integer(res, 2)}
	for i := 3; i+3 < len(res); i += 4 {
		home, err := strconv.Atoi(str(res, i+1))
		if err != nil {
			return InFlight{}, fmt.Errorf("transfers: home %q: %w", str(res, i+1), err)
		}
		f.Stale = append(f.Stale, StaleTransfer{Token: str(res, i), Home: home, User: str(res, i+2), Amount: integer(res, i+3)})
	}
	return f, nil
}

// TransferRecord is one spill out of a sub-pool, parsed from its record.
type TransferRecord struct {
	State  byte // 't' in flight, 'a' acked, 'u' untaken
	Amount int64
	Home   int
	User   string
}

// ParseTransfer reads a transfer record in flight (state 't') or a resolved
// one ('a' or 'u').
func ParseTransfer(rec string, resolved bool) (TransferRecord, error) {
	var t TransferRecord
	t.State = 't'
	if resolved {
		if len(rec) < 2 || rec[1] != ':' || (rec[0] != 'a' && rec[0] != 'u') {
			return t, fmt.Errorf("resolved transfer %q: bad state", rec)
		}
		t.State, rec = rec[0], rec[2:]
	}
	parts := strings.SplitN(rec, ":", 4)
	if len(parts) != 4 {
		return t, fmt.Errorf("transfer %q: want amount:home:ms:user", rec)
	}
	var err error
	if t.Amount, err = strconv.ParseInt(parts[0], 10, 64); err != nil {
		return t, fmt.Errorf("transfer %q: amount: %w", rec, err)
	}
	if t.Home, err = strconv.Atoi(parts[1]); err != nil {
		return t, fmt.Errorf("transfer %q: home: %w", rec, err)
	}
	t.User = parts[3]
	return t, nil
}

// ParseVerdict reads a verdict record: adopted ("a:origin:amount:deadline:user")
// or refused ("r:user").
func ParseVerdict(rec string) (Verdict, error) {
	if strings.HasPrefix(rec, "r:") {
		return Verdict{}, nil
	}
	parts := strings.SplitN(rec, ":", 5)
	if len(parts) != 5 || parts[0] != "a" {
		return Verdict{}, fmt.Errorf("verdict %q: want a:origin:amount:deadline:user or r:user", rec)
	}
	origin, err := strconv.Atoi(parts[1])
	if err != nil {
		return Verdict{}, fmt.Errorf("verdict %q: origin: %w", rec, err)
	}
	amount, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil {
		return Verdict{}, fmt.Errorf("verdict %q: amount: %w", rec, err)
	}
	deadline, err := strconv.ParseInt(parts[3], 10, 64)
	if err != nil {
		return Verdict{}, fmt.Errorf("verdict %q: deadline: %w", rec, err)
	}
	return Verdict{Adopted: true, Origin: origin, Amount: amount, DeadlineMS: deadline}, nil
}
