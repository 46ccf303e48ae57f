// Package lua owns rain's Redis scripts (the *.lua files beside this one,
// embedded) and their typed Go wrappers. Nothing else in rain talks Lua.
//
// Every script works on one sub-pool and takes all its keys in KEYS; the keys
// of sub-pool j of pool P are built by SubPool.Keys alone and all carry the
// hash tag {P:j}, so they would also share a Redis Cluster slot. Scripts run
// with EVALSHA and fall back to EVAL on NOSCRIPT (go-redis Script.Run), so a
// restarted shard with an empty script cache costs one extra round trip.
//
// Every count is an integer and every amount integer cents. Lua numbers are
// doubles, exact to 2^53; rain caps a pool at 1e15 cents so sums stay exact.
package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed setup.lua
	setupSrc string
	//go:embed load.lua
	loadSrc string
	//go:embed open.lua
	openSrc string
	//go:embed claim.lua
	claimSrc string
	//go:embed audit.lua
	auditSrc string
	//go:embed confirm.lua
	confirmSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed take.lua
	takeSrc string
	//go:embed adopt.lua
	adoptSrc string
	//go:embed ack.lua
	ackSrc string
	//go:embed abort.lua
	abortSrc string
	//go:embed transfers.lua
	transfersSrc string

	setupScript     = redis.NewScript(setupSrc)
	loadScript      = redis.NewScript(loadSrc)
	openScript      = redis.NewScript(openSrc)
	claimScript     = redis.NewScript(claimSrc)
	auditScript     = redis.NewScript(auditSrc)
	confirmScript   = redis.NewScript(confirmSrc)
	releaseScript   = redis.NewScript(releaseSrc)
	takeScript      = redis.NewScript(takeSrc)
	adoptScript     = redis.NewScript(adoptSrc)
	ackScript       = redis.NewScript(ackSrc)
	abortScript     = redis.NewScript(abortSrc)
	transfersScript = redis.NewScript(transfersSrc)
)

// ErrSpecMismatch is returned by Setup when the sub-pool exists with another
// count or total.
var ErrSpecMismatch = errors.New("lua: sub-pool exists with a different spec")

// Client is what the wrappers need of a shard: *redis.Client satisfies it.
type Client = redis.Scripter

// SubPool names sub-pool Index of pool Pool.
type SubPool struct {
	Pool  string
	Index int
}

// Keys are the Redis keys of one sub-pool.
type Keys struct {
	Meta      string // hash: spec, state, counters
	Stock     string // list: pre-split amounts
	Grants    string // hash: user -> "state:amount:serial:deadline_ms"
	Deadlines string // zset: user by deadline_ms
	Outbox    string // stream: grants for settlement
	Reserve   string // hash: user -> "token:ms", spill reservations (as a home)
	Transfers string // hash: token -> "amount:home:user:ms", spills out (as a sibling)
	Adopted   string // hash: token -> user, spills in not yet acked (as a home)
}

// Tag is the sub-pool's hash tag, "{P:j}". Pool ids cannot contain braces.
func (s SubPool) Tag() string { return "{" + s.Pool + ":" + strconv.Itoa(s.Index) + "}" }

// Keys builds the sub-pool's keys; they all carry Tag.
func (s SubPool) Keys() Keys {
	p := "rain:" + s.Tag() + ":"
	return Keys{
		Meta:      p + "meta",
		Stock:     p + "stock",
		Grants:    p + "grants",
		Deadlines: p + "deadlines",
		Outbox:    p + "outbox",
		Reserve:   p + "reserve",
		Transfers: p + "transfers",
		Adopted:   p + "adopted",
	}
}

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
		if strings.HasPrefix(err.Error(), "RAINSPEC") {
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
	Loaded  LoadResult = "loaded"  // appended
	Skipped LoadResult = "skipped" // not the next batch: already in, or out of order
	Open    LoadResult = "open"    // the sub-pool is open; nothing appended
)

// LoadCmd queues batch number batch of amounts on pipe; its result is read
// with ParseLoad after the pipeline runs. Batches apply in order, once each.
// The pipeline sends EVALSHA; the caller must have loaded the script (see
// LoadScripts) on the shard first.
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

// LoadScripts loads every script into c's script cache, so that pipelined
// EVALSHA finds them.
func LoadScripts(ctx context.Context, c Client) error {
	for _, s := range []*redis.Script{setupScript, loadScript, openScript, claimScript, auditScript, confirmScript,
		releaseScript, takeScript, adoptScript, ackScript, abortScript, transfersScript} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("script load: %w", err)
		}
	}
	return nil
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

// Outcome is the result of a claim.
type Outcome uint8

// Claim outcomes.
const (
	Granted    Outcome = iota + 1 // a new grant
	Already                       // the user's existing grant
	Empty                         // no stock left in this sub-pool
	NotStarted                    // before the window; Claim.Wait says how long
	Ended                         // after the window
	Closed                        // the sub-pool is not open
	Reserved                      // empty; a spill reservation was recorded
	Busy                          // the user has a spill in flight: retry
)

// Claim is a claim's answer. Amount, Serial and DeadlineMS are set for
// Granted and Already; WaitMS for NotStarted.
type Claim struct {
	Outcome    Outcome
	Amount     int64
	Serial     int64
	DeadlineMS int64
	WaitMS     int64
}

// ClaimGrant runs the claim script: the user's grant in the sub-pool if they
// hold one, else a new one with serial, popped from the stock. One round trip.
// With a spill token (pools of several sub-pools), an empty sub-pool records
// a reservation valid for validityMS and answers Reserved.
func ClaimGrant(ctx context.Context, c Client, k *Keys, user string, serial int64, token string, validityMS int64) (Claim, error) {
	res, err := claimScript.Run(ctx, c, claimKeys(k), user, serial, token, validityMS).Slice()
	if err != nil {
		return Claim{}, err
	}
	return parseClaim(res)
}

// ClaimCmd queues a claim on a pipeline as EVALSHA; read it with ParseClaim.
// A shard whose script cache is empty answers NOSCRIPT (IsNoScript): load
// the scripts (LoadScripts) and queue the claim again.
func ClaimCmd(ctx context.Context, pipe redis.Pipeliner, k *Keys, user string, serial int64, token string, validityMS int64) *redis.Cmd {
	return claimScript.EvalSha(ctx, pipe, claimKeys(k), user, serial, token, validityMS)
}

// ParseClaim reads the result of a ClaimCmd.
func ParseClaim(cmd *redis.Cmd) (Claim, error) {
	res, err := cmd.Slice()
	if err != nil {
		return Claim{}, err
	}
	return parseClaim(res)
}

// IsNoScript reports whether err says the shard lacks the script.
func IsNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

func claimKeys(k *Keys) []string {
	return []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox, k.Reserve}
}

func parseClaim(res []any) (Claim, error) {
	switch str(res, 0) {
	case "granted":
		return Claim{Outcome: Granted, Amount: integer(res, 1), Serial: integer(res, 2), DeadlineMS: integer(res, 3)}, nil
	case "already":
		return Claim{Outcome: Already, Amount: integer(res, 1), Serial: integer(res, 2), DeadlineMS: integer(res, 3)}, nil
	case "empty":
		return Claim{Outcome: Empty}, nil
	case "not_started":
		return Claim{Outcome: NotStarted, WaitMS: integer(res, 1)}, nil
	case "ended":
		return Claim{Outcome: Ended}, nil
	case "closed":
		return Claim{Outcome: Closed}, nil
	case "reserved":
		return Claim{Outcome: Reserved}, nil
	case "busy":
		return Claim{Outcome: Busy}, nil
	}
	return Claim{}, fmt.Errorf("claim: unexpected reply %v", res)
}

// Confirmation is what a confirm did.
type Confirmation uint8

// Confirm results.
const (
	Confirmed        Confirmation = iota + 1 // held, now confirmed
	AlreadyConfirmed                         // confirmed before: nothing to do
	WasReleased                              // released at its deadline: too late
	SerialMismatch                           // the user's grant has another serial
	UnknownGrant                             // the user holds no grant here
)

// Confirm moves the user's held grant with serial to confirmed.
func Confirm(ctx context.Context, c Client, k *Keys, user string, serial int64) (Confirmation, error) {
	res, err := confirmScript.Run(ctx, c, []string{k.Meta, k.Grants, k.Deadlines}, user, serial).Slice()
	if err != nil {
		return 0, err
	}
	switch str(res, 0) {
	case "confirmed":
		return Confirmed, nil
	case "already":
		return AlreadyConfirmed, nil
	case "released":
		return WasReleased, nil
	case "mismatch":
		return SerialMismatch, nil
	case "unknown":
		return UnknownGrant, nil
	}
	return 0, fmt.Errorf("confirm: unexpected reply %v", res)
}

// Release is what one release call did.
type Release struct {
	Count, Cents int64
	// OldestOverdueMS is how long past its deadline the oldest overdue grant
	// was when the call began; 0 if none was.
	OldestOverdueMS int64
	// More is true when the batch was full: more grants may be due.
	More bool
}

// ReleaseExpired releases up to limit grants of the sub-pool that are still
// held and past their deadline (by the shard's clock): amounts back to the
// stock, grants marked released, counters, an outbox record each.
func ReleaseExpired(ctx context.Context, c Client, k *Keys, limit int) (Release, error) {
	res, err := releaseScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox}, limit).Slice()
	if err != nil {
		return Release{}, err
	}
	return Release{Count: integer(res, 0), Cents: integer(res, 1), OldestOverdueMS: integer(res, 2), More: integer(res, 3) == 1}, nil
}

// Take moves one amount of sibling sub-pool k into an in-flight transfer
// for user, whose home sub-pool is home. It returns the amount, or 0 when the
// sub-pool is empty (or not open). Taking again with a token returns the same
// transfer.
func Take(ctx context.Context, c Client, k *Keys, token string, home int, user string) (int64, error) {
	res, err := takeScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Transfers}, token, home, user).Slice()
	if err != nil {
		return 0, err
	}
	if str(res, 0) != "taken" {
		return 0, nil
	}
	return integer(res, 1), nil
}

// Adopt turns user's reservation at home (keys k) into a held grant of
// amount from sibling origin, if the reservation still carries token and is
// younger than validityMS. ok is false when it is stale.
func Adopt(ctx context.Context, c Client, k *Keys, user, token string, serial, amount int64, origin int, validityMS int64) (Claim, bool, error) {
	res, err := adoptScript.Run(ctx, c, []string{k.Meta, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Adopted},
		user, token, serial, amount, origin, validityMS).Slice()
	if err != nil {
		return Claim{}, false, err
	}
	if str(res, 0) != "granted" {
		return Claim{}, false, nil
	}
	return Claim{Outcome: Granted, Amount: integer(res, 1), Serial: integer(res, 2), DeadlineMS: integer(res, 3)}, true, nil
}

// Ack drops a transfer the home granted; Untake puts one the home did not
// back in the stock. Both are idempotent; done is false when the transfer was
// already gone.
func Ack(ctx context.Context, c Client, k *Keys, token string) (done bool, err error) {
	return settleTransfer(ctx, c, k, token, "ack")
}

// Untake: see Ack.
func Untake(ctx context.Context, c Client, k *Keys, token string) (done bool, err error) {
	return settleTransfer(ctx, c, k, token, "untake")
}

func settleTransfer(ctx context.Context, c Client, k *Keys, token, op string) (bool, error) {
	res, err := ackScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Transfers}, token, op).Slice()
	if err != nil {
		return false, err
	}
	return str(res, 0) != "gone", nil
}

// Abort drops user's reservation at home if it still carries token.
func Abort(ctx context.Context, c Client, k *Keys, user, token string) error {
	return abortScript.Run(ctx, c, []string{k.Reserve}, user, token).Err()
}

// StaleTransfer is a transfer out of a sub-pool old enough to resolve.
type StaleTransfer struct {
	Token string
	Home  int
	User  string
}

// StaleTransfers drops the sub-pool's reservations older than validityMS and
// lists its transfers older than validityMS + marginMS.
func StaleTransfers(ctx context.Context, c Client, k *Keys, validityMS, marginMS int64) (dropped int64, stale []StaleTransfer, err error) {
	res, err := transfersScript.Run(ctx, c, []string{k.Reserve, k.Transfers}, validityMS, marginMS).Slice()
	if err != nil {
		return 0, nil, err
	}
	for i := 1; i+2 < len(res); i += 3 {
		home, _ := strconv.Atoi(str(res, i+1))
		stale = append(stale, StaleTransfer{Token: str(res, i), Home: home, User: str(res, i+2)})
	}
	return integer(res, 0), stale, nil
}

// WasAdopted reports whether the home (keys k) adopted the transfer token:
// its grant was made, whatever became of it since.
func WasAdopted(ctx context.Context, c redis.Cmdable, k *Keys, token string) (bool, error) {
	return c.HExists(ctx, k.Adopted, token).Result()
}

// ForgetAdopted drops token from the home's adopted set once the sibling has
// acked it.
func ForgetAdopted(ctx context.Context, c redis.Cmdable, k *Keys, token string) error {
	return c.HDel(ctx, k.Adopted, token).Err()
}

// Audit is one sub-pool read whole: the meta counters beside recounts of the
// stock list and the grants hash.
type Audit struct {
	Found                                 bool
	State                                 string
	Count, Cents                          int64 // what it was preloaded with
	StockCount, StockCents                int64 // meta counters
	ListLen, ListSum                      int64 // recount of the stock list
	HeldCount, HeldCents                  int64 // meta counters
	GrantsHeld, GrantsHeldCents           int64 // recount of held grants
	ConfirmedCount, ConfirmedCents        int64
	GrantsConfirmed, GrantsConfirmedCents int64
	ReleasedCount, ReleasedCents          int64
	GrantsReleased                        int64
	Deadlines                             int64 // entries in the deadline index
	DuplicateSerials                      int64
	BadRecords                            int64
	ReceivedCount, ReceivedCents          int64 // granted here, taken from siblings
	SentCount, SentCents                  int64 // taken from here, granted at siblings
	InflightCount, InflightCents          int64 // taken from here, not yet acknowledged
	Transfers, TransfersCents             int64 // recount of the transfers hash
}

// AuditSubPool reads the sub-pool whole, atomically.
func AuditSubPool(ctx context.Context, c Client, sp SubPool) (Audit, error) {
	k := sp.Keys()
	res, err := auditScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Transfers}).Slice()
	if err != nil {
		return Audit{}, fmt.Errorf("audit %s: %w", sp.Tag(), err)
	}
	if integer(res, 0) == 0 {
		return Audit{}, nil
	}
	n := func(i int) int64 { return integer(res, i) }
	return Audit{
		Found: true, State: str(res, 1), Count: n(2), Cents: n(3),
		StockCount: n(4), StockCents: n(5), ListLen: n(6), ListSum: n(7),
		HeldCount: n(8), HeldCents: n(9), GrantsHeld: n(10), GrantsHeldCents: n(11),
		ConfirmedCount: n(12), ConfirmedCents: n(13), GrantsConfirmed: n(14), GrantsConfirmedCents: n(15),
		ReleasedCount: n(16), ReleasedCents: n(17), GrantsReleased: n(18),
		Deadlines: n(19), DuplicateSerials: n(20), BadRecords: n(21),
		ReceivedCount: n(22), ReceivedCents: n(23), SentCount: n(24), SentCents: n(25),
		InflightCount: n(26), InflightCents: n(27), Transfers: n(28), TransfersCents: n(29),
	}, nil
}

func str(res []any, i int) string {
	if i < len(res) {
		if s, ok := res[i].(string); ok {
			return s
		}
	}
	return ""
}

func integer(res []any, i int) int64 {
	if i < len(res) {
		if n, ok := res[i].(int64); ok {
			return n
		}
	}
	return 0
}
