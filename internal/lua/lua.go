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
	//go:embed claim_many.lua
	claimManySrc string
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
	//go:embed decide.lua
	decideSrc string
	//go:embed transfers.lua
	transfersSrc string
	//go:embed record.lua
	recordSrc string
	//go:embed serial.lua
	serialSrc string
	//go:embed watermark.lua
	watermarkSrc string

	setupScript     = redis.NewScript(setupSrc)
	loadScript      = redis.NewScript(loadSrc)
	openScript      = redis.NewScript(openSrc)
	claimManyScript = redis.NewScript(claimManySrc)
	auditScript     = redis.NewScript(auditSrc)
	confirmScript   = redis.NewScript(confirmSrc)
	releaseScript   = redis.NewScript(releaseSrc)
	takeScript      = redis.NewScript(takeSrc)
	adoptScript     = redis.NewScript(adoptSrc)
	ackScript       = redis.NewScript(ackSrc)
	abortScript     = redis.NewScript(abortSrc)
	decideScript    = redis.NewScript(decideSrc)
	transfersScript = redis.NewScript(transfersSrc)
	recordScript    = redis.NewScript(recordSrc)
	serialScript    = redis.NewScript(serialSrc)
	watermarkScript = redis.NewScript(watermarkSrc)

	// scripts is every script, for LoadScripts and SHA.
	scripts = map[string]*redis.Script{
		"setup": setupScript, "load": loadScript, "open": openScript, "claim_many": claimManyScript,
		"audit": auditScript, "confirm": confirmScript, "release": releaseScript,
		"take": takeScript, "adopt": adoptScript, "ack": ackScript, "abort": abortScript,
		"decide": decideScript, "transfers": transfersScript, "record": recordScript,
		"serial": serialScript, "watermark": watermarkScript,
	}
)

// SHA is the SHA1 of the named script (the file name without .lua), as
// EVALSHA sends it; "" for no such script. Fault tests match commands by it.
func SHA(name string) string {
	if s := scripts[name]; s != nil {
		return s.Hash()
	}
	return ""
}

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
	Transfers string // hash: token -> "amount:home:ms:user", spills out in flight (as a sibling)
	Settled   string // hash: token -> "a|u:amount:home:ms:user", spills out acked or untaken
	Verdicts  string // hash: token -> "a:origin:amount:deadline_ms:user" | "r:user" (as a home)
}

// Tag is the sub-pool's hash tag, "{P:j}". Pool ids cannot contain braces.
func (s SubPool) Tag() string { return "{" + s.Pool + ":" + strconv.Itoa(s.Index) + "}" }

// Keys builds the sub-pool's keys; they all carry Tag. It is the only place
// sub-pool keys are made.
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
		Settled:   p + "settled",
		Verdicts:  p + "verdicts",
	}
}

// All lists every key of the sub-pool.
func (k Keys) All() []string {
	return []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Transfers, k.Settled, k.Verdicts}
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

// LoadScripts loads every script into c's script cache, so that pipelined
// EVALSHA finds them.
func LoadScripts(ctx context.Context, c Client) error {
	for name, s := range scripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("load script %s: %w", name, err)
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

// ClaimArg is one claim of a batch: the user, the serial for a new grant,
// and the spill token ("" for pools of one sub-pool).
type ClaimArg struct {
	User   string
	Serial int64
	Token  string
}

// ClaimManyCmd queues the claims of one batch on one sub-pool as one
// EVALSHA of claim_many on pipe: each claim decided in order, atomically,
// as if it came alone (see claim_many.lua). Read it with ParseClaimMany. A shard whose script
// cache is empty answers NOSCRIPT (IsNoScript): load the scripts and run the
// batch again with ClaimMany. args is the caller's to reuse once the command
// has been sent.
func ClaimManyCmd(ctx context.Context, pipe redis.Pipeliner, k *Keys, validityMS int64, claims []ClaimArg, args []any) *redis.Cmd {
	return claimManyScript.EvalSha(ctx, pipe, claimKeys(k), claimManyArgs(args, validityMS, claims)...)
}

// ClaimMany runs claim_many at once (EVALSHA, EVAL on NOSCRIPT).
func ClaimMany(ctx context.Context, c Client, k *Keys, validityMS int64, claims []ClaimArg) ([]Claim, []error, error) {
	res, err := claimManyScript.Run(ctx, c, claimKeys(k), claimManyArgs(nil, validityMS, claims)...).Slice()
	if err != nil {
		return nil, nil, err
	}
	return parseClaimMany(res, len(claims))
}

func claimManyArgs(args []any, validityMS int64, claims []ClaimArg) []any {
	args = append(args[:0], validityMS)
	for _, c := range claims {
		args = append(args, c.User, c.Serial, c.Token)
	}
	return args
}

// ParseClaimMany reads the result of a ClaimManyCmd of n claims: each
// claim's answer, or its own error (a bad grant record); err is set when
// the batch as a whole failed (then nothing else is).
func ParseClaimMany(cmd *redis.Cmd, n int) (claims []Claim, errs []error, err error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, nil, err
	}
	return parseClaimMany(res, n)
}

func parseClaimMany(res []any, n int) ([]Claim, []error, error) {
	if len(res) != n {
		return nil, nil, fmt.Errorf("claim_many: %d answers for %d claims", len(res), n)
	}
	claims, errs := make([]Claim, n), make([]error, n)
	for i, r := range res {
		one, ok := r.([]any)
		switch {
		case !ok:
			errs[i] = fmt.Errorf("claim_many: unexpected answer %v", r)
		case str(one, 0) == "error":
			errs[i] = errors.New(str(one, 1))
		default:
			claims[i], errs[i] = parseClaim(one)
		}
	}
	return claims, errs, nil
}

// IsNoScript reports whether err says the shard lacks the script.
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

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

// Confirm moves the user's held grant with serial to confirmed. Sent again,
// it answers AlreadyConfirmed: the same effect.
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

// Released is what one release call did.
type Released struct {
	Count, Cents int64
	// OldestOverdueMS is how long past its deadline the oldest overdue grant
	// was when the call began; 0 if none was.
	OldestOverdueMS int64
	// More is true when the batch was full: more grants may be due.
	More bool
	// NextMS is how long until a grant of the sub-pool can next fall due.
	NextMS int64
}

// ReleaseExpired releases up to limit grants of the sub-pool that are still
// held and past their deadline (by the shard's clock): amounts back to the
// stock, grants marked released, counters, an outbox record each. Sent
// again, it releases nothing twice (what it released is no longer held).
func ReleaseExpired(ctx context.Context, c Client, k *Keys, limit int) (Released, error) {
	res, err := releaseScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox}, limit).Slice()
	if err != nil {
		return Released{}, err
	}
	return Released{Count: integer(res, 0), Cents: integer(res, 1), OldestOverdueMS: integer(res, 2), More: integer(res, 3) == 1,
		NextMS: integer(res, 4)}, nil
}

// Taken is what a take did.
type Taken uint8

// Take results.
const (
	TakenAmount  Taken = iota + 1 // the amount is in flight under the token
	TakeEmpty                     // the sub-pool has no stock (or is not open)
	TakeSettled                   // the token's transfer was acked or untaken already
	TakeConflict                  // the token is stored for another user or home
)

// Take moves one amount of sibling sub-pool k into an in-flight transfer
// for user, whose home sub-pool is home. Taking again with a token returns
// the same transfer, as long as it is in flight.
func Take(ctx context.Context, c Client, k *Keys, token string, home int, user string) (Taken, int64, error) {
	res, err := takeScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Transfers, k.Settled}, token, home, user).Slice()
	if err != nil {
		return 0, 0, err
	}
	switch str(res, 0) {
	case "taken":
		return TakenAmount, integer(res, 1), nil
	case "empty", "closed":
		return TakeEmpty, 0, nil
	case "settled":
		return TakeSettled, 0, nil
	case "conflict":
		return TakeConflict, 0, nil
	}
	return 0, 0, fmt.Errorf("take: unexpected reply %v", res)
}

// Adopt turns user's reservation at home (keys k) into a held grant of
// amount from sibling origin, if the reservation still carries token and is
// younger than validityMS and the user holds no grant; else it records the
// token as refused and ok is false. Sent again, it answers as the first run did.
func Adopt(ctx context.Context, c Client, k *Keys, user, token string, serial, amount int64, origin int, validityMS int64) (Claim, bool, error) {
	res, err := adoptScript.Run(ctx, c, []string{k.Meta, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Verdicts},
		user, token, serial, amount, origin, validityMS).Slice()
	if err != nil {
		return Claim{}, false, err
	}
	if str(res, 0) != "granted" {
		return Claim{}, false, nil
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
func Decide(ctx context.Context, c Client, k *Keys, token, user string) (Verdict, error) {
	res, err := decideScript.Run(ctx, c, []string{k.Reserve, k.Verdicts}, token, user).Slice()
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

// Settlement is what an ack or an untake did.
type Settlement uint8

// Ack and Untake results.
const (
	Acked          Settlement = iota + 1 // the transfer is sent (granted at its home)
	Returned                             // the amount is back in the stock
	NoTransfer                           // no transfer under the token
	SettleConflict                       // settled the other way already
)

// Ack marks a transfer the home adopted as sent; Untake puts one the home
// refused back in the stock. Both are idempotent: sent again, each answers
// as the first run did.
func Ack(ctx context.Context, c Client, k *Keys, token string) (Settlement, error) {
	return settleTransfer(ctx, c, k, token, "ack")
}

// Untake: see Ack.
func Untake(ctx context.Context, c Client, k *Keys, token string) (Settlement, error) {
	return settleTransfer(ctx, c, k, token, "untake")
}

func settleTransfer(ctx context.Context, c Client, k *Keys, token, op string) (Settlement, error) {
	res, err := ackScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Transfers, k.Settled}, token, op).Slice()
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
		return SettleConflict, nil
	}
	return 0, fmt.Errorf("%s: unexpected reply %v", op, res)
}

// Abort refuses token at home and drops user's reservation if it still
// carries the token. adopted is true when the home had adopted the token
// already: then there is nothing to abort.
func Abort(ctx context.Context, c Client, k *Keys, user, token string) (adopted bool, err error) {
	res, err := abortScript.Run(ctx, c, []string{k.Reserve, k.Verdicts}, user, token).Slice()
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

// StaleTransfers drops the sub-pool's reservations older than validityMS and
// lists its transfers in flight for more than ageMS; nextMS is how long
// until one can next be.
func StaleTransfers(ctx context.Context, c Client, k *Keys, validityMS, ageMS int64) (stale []StaleTransfer, nextMS int64, err error) {
	res, err := transfersScript.Run(ctx, c, []string{k.Reserve, k.Transfers}, validityMS, ageMS).Slice()
	if err != nil {
		return nil, 0, err
	}
	for i := 2; i+3 < len(res); i += 4 {
		home, err := strconv.Atoi(str(res, i+1))
		if err != nil {
			return nil, 0, fmt.Errorf("transfers: home %q: %w", str(res, i+1), err)
		}
		stale = append(stale, StaleTransfer{Token: str(res, i), Home: home, User: str(res, i+2), Amount: integer(res, i+3)})
	}
	return stale, integer(res, 1), nil
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

// ReserveSerials runs the serial script: the counter at key becomes
// max(counter, floor) + n, which it returns.
func ReserveSerials(ctx context.Context, c Client, key string, n, floor int64) (int64, error) {
	return serialScript.Run(ctx, c, []string{key}, n, floor).Int64()
}

// RaiseWatermark raises the watermark at key to at least v and returns it.
func RaiseWatermark(ctx context.Context, c Client, key string, v int64) (int64, error) {
	return watermarkScript.Run(ctx, c, []string{key}, v).Int64()
}

// SubPoolAudit is one sub-pool read for the audit: the meta counters beside
// recounts of the stock list, the grants and the spill records. Field names
// are the script's reply names.
type SubPoolAudit struct {
	Found                          bool
	State                          string
	Version                        int64 // bumped by every money move
	Count, Cents                   int64 // what it was preloaded with
	StockCount, StockCents         int64 // meta counters
	HeldCount, HeldCents           int64
	ConfirmedCount, ConfirmedCents int64
	ReleasedCount, ReleasedCents   int64
	ReceivedCount, ReceivedCents   int64 // granted here, taken from siblings
	SentCount, SentCents           int64 // taken from here, acked by their homes
	InflightCount, InflightCents   int64 // taken from here, not settled yet
	ListLen                        int64 // LLEN of the stock, read with the counters
	DeadlineEntries                int64 // entries in the deadline index, read with the counters
	Transfers, TransfersCents      int64 // recount of transfers in flight, read with the counters
	BadRecords                     int64 // grant and spill records that do not parse

	// The recounts below are read in pages after the counters; Recounted
	// says the sub-pool did not change meanwhile (its version held), so
	// they may be compared with the counters. On a pool in the middle of a
	// rain they may not be: the counter checks above hold regardless.
	Recounted                             bool
	ListSum                               int64 // recount of the stock list
	GrantsHeld, GrantsHeldCents           int64 // recount of the grants by state
	GrantsConfirmed, GrantsConfirmedCents int64
	GrantsReleased, GrantsReleasedCents   int64
	DuplicateSerials                      int64
	Acked, AckedCents                     int64 // recount of settled transfers
	Untaken, UntakenCents                 int64
	Adopted, AdoptedCents                 int64 // recount of adopted verdicts

	// The spill records, for matching across sub-pools (token -> record).
	TransferRecords, SettledRecords, VerdictRecords map[string]string
}

func (a *SubPoolAudit) numbers() map[string]*int64 {
	return map[string]*int64{
		"count": &a.Count, "cents": &a.Cents, "stock_count": &a.StockCount, "stock_cents": &a.StockCents,
		"held_count": &a.HeldCount, "held_cents": &a.HeldCents,
		"confirmed_count": &a.ConfirmedCount, "confirmed_cents": &a.ConfirmedCents,
		"released_count": &a.ReleasedCount, "released_cents": &a.ReleasedCents,
		"received_count": &a.ReceivedCount, "received_cents": &a.ReceivedCents,
		"sent_count": &a.SentCount, "sent_cents": &a.SentCents,
		"inflight_count": &a.InflightCount, "inflight_cents": &a.InflightCents,
		"version": &a.Version, "list_len": &a.ListLen, "deadline_entries": &a.DeadlineEntries,
		"transfers": &a.Transfers, "transfers_cents": &a.TransfersCents, "bad_records": &a.BadRecords,
	}
}

// Audit paging: how much one command of the recount reads. An LRANGE of
// 5,000 amounts or an HSCAN of about 500 grants takes a shard about 1 ms
// (2.5 ms on a loaded machine), so an audit of any size never holds a rain
// up for 5 ms.
const (
	auditListPage = 5_000
	auditHashPage = 500
	auditTries    = 3 // recounts tried before a changing sub-pool is left unrecounted
)

// AuditSubPool reads the sub-pool for the audit: its counters atomically
// (one script, constant time), then the recounts in bounded pages; when the
// sub-pool's version moved meanwhile it reads both again, at most
// auditTries times, and then returns with Recounted false: the counters
// hold, the recount sums are not to be compared with them, and the spill
// records read are still good for matching (they only move forward).
func AuditSubPool(ctx context.Context, c redis.Cmdable, sp SubPool) (SubPoolAudit, error) {
	k := sp.Keys()
	for try := 1; ; try++ {
		a, err := auditCounters(ctx, c, sp, &k)
		if err != nil || !a.Found {
			return a, err
		}
		r := a
		if err := recount(ctx, c, &k, &r); err != nil {
			return a, fmt.Errorf("audit %s: %w", sp.Tag(), err)
		}
		v, err := c.HGet(ctx, k.Meta, "version").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return a, fmt.Errorf("audit %s: %w", sp.Tag(), err)
		}
		if v == a.Version {
			r.Recounted = true
			return r, nil
		}
		if try == auditTries {
			return r, nil // its records serve the spill matching; its sums are not trusted
		}
	}
}

// auditCounters runs the audit script: the counters and what goes with them.
func auditCounters(ctx context.Context, c redis.Cmdable, sp SubPool, k *Keys) (SubPoolAudit, error) {
	res, err := auditScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Deadlines, k.Transfers}).Slice()
	if err != nil {
		return SubPoolAudit{}, fmt.Errorf("audit %s: %w", sp.Tag(), err)
	}
	var a SubPoolAudit
	nums := a.numbers()
	for i := 0; i+1 < len(res); i += 2 {
		name := str(res, i)
		switch v := res[i+1].(type) {
		case int64:
			if name == "found" {
				a.Found = v == 1
			} else if p := nums[name]; p != nil {
				*p = v
			} else {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
		case string:
			if name != "state" {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
			a.State = v
		case []any:
			if name != "transfers_list" {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
			a.TransferRecords = pairs(v)
		}
	}
	return a, nil
}

// recount reads the stock list and the grants, settled and verdicts hashes
// page by page into a's recount fields.
func recount(ctx context.Context, c redis.Cmdable, k *Keys, a *SubPoolAudit) error {
	for off := int64(0); ; off += auditListPage {
		items, err := c.LRange(ctx, k.Stock, off, off+auditListPage-1).Result()
		if err != nil {
			return err
		}
		for _, it := range items {
			n, err := strconv.ParseInt(it, 10, 64)
			if err != nil {
				a.BadRecords++
				continue
			}
			a.ListSum += n
		}
		if len(items) < auditListPage {
			break
		}
	}
	serials := map[string]bool{}
	err := scanHash(ctx, c, k.Grants, func(_, rec string) {
		st, amount, serial, ok := grantFields(rec)
		switch {
		case !ok:
			a.BadRecords++
			return
		case st == 'h':
			a.GrantsHeld, a.GrantsHeldCents = a.GrantsHeld+1, a.GrantsHeldCents+amount
		case st == 'c':
			a.GrantsConfirmed, a.GrantsConfirmedCents = a.GrantsConfirmed+1, a.GrantsConfirmedCents+amount
		case st == 'r':
			a.GrantsReleased, a.GrantsReleasedCents = a.GrantsReleased+1, a.GrantsReleasedCents+amount
		default:
			a.BadRecords++
			return
		}
		if serials[serial] {
			a.DuplicateSerials++
		}
		serials[serial] = true
	})
	if err != nil {
		return err
	}
	a.SettledRecords = map[string]string{}
	if err := scanHash(ctx, c, k.Settled, func(token, rec string) {
		a.SettledRecords[token] = rec
		t, err := ParseTransfer(rec, true)
		switch {
		case err != nil:
			a.BadRecords++
		case t.State == 'a':
			a.Acked, a.AckedCents = a.Acked+1, a.AckedCents+t.Amount
		default:
			a.Untaken, a.UntakenCents = a.Untaken+1, a.UntakenCents+t.Amount
		}
	}); err != nil {
		return err
	}
	a.VerdictRecords = map[string]string{}
	return scanHash(ctx, c, k.Verdicts, func(token, rec string) {
		a.VerdictRecords[token] = rec
		v, err := ParseVerdict(rec)
		switch {
		case err != nil:
			a.BadRecords++
		case v.Adopted:
			a.Adopted, a.AdoptedCents = a.Adopted+1, a.AdoptedCents+v.Amount
		}
	})
}

// scanHash calls f once per field of the hash at key, reading it with HSCAN
// in pages of about auditHashPage (a field HSCAN returns twice, as it may
// while the hash grows, is seen once).
func scanHash(ctx context.Context, c redis.Cmdable, key string, f func(field, value string)) error {
	seen := map[string]bool{}
	var cursor uint64
	for {
		kv, next, err := c.HScan(ctx, key, cursor, "", auditHashPage).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if !seen[kv[i]] {
				seen[kv[i]] = true
				f(kv[i], kv[i+1])
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// grantFields parses a grant record "state:amount:serial:deadline_ms".
func grantFields(rec string) (state byte, amount int64, serial string, ok bool) {
	parts := strings.Split(rec, ":")
	if len(parts) != 4 || len(parts[0]) != 1 {
		return 0, 0, "", false
	}
	amount, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return 0, 0, "", false
	}
	if _, err := strconv.ParseInt(parts[2], 10, 64); err != nil {
		return 0, 0, "", false
	}
	if _, err := strconv.ParseInt(parts[3], 10, 64); err != nil {
		return 0, 0, "", false
	}
	return parts[0][0], amount, parts[2], true
}

func pairs(v []any) map[string]string {
	m := make(map[string]string, len(v)/2)
	for j := 0; j+1 < len(v); j += 2 {
		m[str(v, j)] = str(v, j+1)
	}
	return m
}

// TransferRecord is one spill out of a sub-pool, parsed from its record.
type TransferRecord struct {
	State  byte // 't' in flight, 'a' acked, 'u' untaken
	Amount int64
	Home   int
	User   string
}

// ParseTransfer reads a transfer record (state 't') or a settled one.
func ParseTransfer(rec string, settled bool) (TransferRecord, error) {
	var t TransferRecord
	t.State = 't'
	if settled {
		if len(rec) < 2 || rec[1] != ':' || (rec[0] != 'a' && rec[0] != 'u') {
			return t, fmt.Errorf("settled transfer %q: bad state", rec)
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
