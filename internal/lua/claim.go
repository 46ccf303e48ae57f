package lua

// This file is a grant's life on its sub-pool: the claim that makes it, the
// confirm that keeps it, the release that gives its amount back.

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"rain"
)

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
//
// With fence the caller WAITs for a replica after the script on the same
// connection: a run that answers a grant made before it then writes a
// counter, so the WAIT covers that grant too (see claim_many.lua). form
// says how the grants made are written (Form).
func ClaimManyCmd(ctx context.Context, pipe redis.Pipeliner, k *rain.Keys, validityMS int64, fence bool, form Form, claims []ClaimArg, args []any) *redis.Cmd {
	return claimManyScript.EvalSha(ctx, pipe, claimKeys(k), claimManyArgs(args, validityMS, fence, form, claims)...)
}

// Form is how claim_many writes the grants it makes. The zero Form is what
// every earlier release writes and reads.
type Form struct {
	// Outbox is the form of the grants' outbox entries (see prelude.lua
	// and ParseOutboxEntries).
	Outbox OutboxForm
	// BatchedDeadlines: the grants of a batch are named by one member of
	// the deadline index's batches key; else each by a member of its own
	// in deadlines, the only form a reaper older than the batches key
	// releases (see prelude.lua, the deadline index).
	BatchedDeadlines bool
}

// OutboxForm is the form of a grant's outbox entry. Each is read by every
// rain settle since the release that brought it, and by none before.
type OutboxForm uint8

const (
	// OutboxFields: an entry per grant, a field per value, the only form
	// a rain settle older than the packed form pays.
	OutboxFields OutboxForm = iota
	// OutboxPacked: an entry per grant, one field (g).
	OutboxPacked
	// OutboxBatch: one entry of one field (G) for the grants of a batch.
	OutboxBatch
)

// ParseOutboxForm reads an outbox form by its name (rain serve --outbox):
// fields, packed or batch.
func ParseOutboxForm(s string) (OutboxForm, bool) {
	for f, name := range outboxForms {
		if s == name {
			return OutboxForm(f), true
		}
	}
	return 0, false
}

var outboxForms = [...]string{OutboxFields: "fields", OutboxPacked: "packed", OutboxBatch: "batch"}

func (f OutboxForm) String() string {
	if int(f) < len(outboxForms) {
		return outboxForms[f]
	}
	return fmt.Sprintf("OutboxForm(%d)", uint8(f))
}

// arg is the form as claim_many's ARGV[3] gives it: the outbox form's
// name, then " batched" when the deadlines are (formArgs: nothing is built
// per batch).
func (f Form) arg() string {
	if int(f.Outbox) >= len(formArgs) {
		return f.Outbox.String() // unknown: claim_many writes fields
	}
	if f.BatchedDeadlines {
		return formArgs[f.Outbox][1]
	}
	return formArgs[f.Outbox][0]
}

// formArgs is each form's arg: by outbox form, without and with batched
// deadlines.
var formArgs = func() (a [len(outboxForms)][2]string) {
	for f, name := range outboxForms {
		a[f] = [2]string{name, name + " batched"}
	}
	return a
}()

// ClaimMany runs claim_many at once (EVALSHA, EVAL on NOSCRIPT), without a
// fence, in the zero Form (rain serve's default, which every rain settle
// pays and every reaper releases).
func ClaimMany(ctx context.Context, c Client, k *rain.Keys, validityMS int64, claims []ClaimArg) ([]Claim, []error, error) {
	res, err := claimManyScript.Run(ctx, c, claimKeys(k), claimManyArgs(nil, validityMS, false, Form{}, claims)...).Slice()
	if err != nil {
		return nil, nil, err
	}
	return parseClaimMany(res, len(claims))
}

func claimManyArgs(args []any, validityMS int64, fence bool, form Form, claims []ClaimArg) []any {
	args = append(args[:0], validityMS, fenceFlag(fence), form.arg())
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

func claimKeys(k *rain.Keys) []string {
	return []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Batches}
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
	AmountMismatch                           // ConfirmMany: the grant's amount is not the one given
)

// Confirm moves the user's held grant with serial to confirmed. Sent again,
// it answers AlreadyConfirmed: the same effect.
func Confirm(ctx context.Context, c Client, k *rain.Keys, user string, serial int64) (Confirmation, error) {
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

// ConfirmArg is one grant of a batch to confirm: its user, serial and
// amount (what settlement is about to pay).
type ConfirmArg struct {
	User   string
	Serial int64
	Amount int64
}

// ConfirmResult is the answer for one grant of ConfirmMany: what the
// confirm did, and the grant's amount when it is confirmed (now or before)
// or is not the one given (AmountMismatch).
type ConfirmResult struct {
	Result Confirmation
	Amount int64
}

// ConfirmMany confirms a batch of grants of one sub-pool, each as Confirm
// does and only with the amount given, in one script: one answer per
// grant, or the grant's own error (a bad record); err is set when the batch
// as a whole failed.
func ConfirmMany(ctx context.Context, c Client, k *rain.Keys, grants []ConfirmArg) ([]ConfirmResult, []error, error) {
	res, err := confirmManyScript.Run(ctx, c, []string{k.Meta, k.Grants, k.Deadlines}, confirmManyArgs(false, grants)...).Slice()
	if err != nil {
		return nil, nil, err
	}
	return parseConfirmMany(res, len(grants))
}

// ConfirmManyCmd queues ConfirmMany on pipe as EVALSHA, with the fence
// (see confirm_many.lua) when a WAIT is queued after it on the same
// connection, which then covers every confirm it answers; read it with
// ParseConfirmMany. A shard whose script cache is empty answers NOSCRIPT
// (IsNoScript): nothing ran; load the scripts and send it again.
func ConfirmManyCmd(ctx context.Context, pipe redis.Pipeliner, k *rain.Keys, fence bool, grants []ConfirmArg) *redis.Cmd {
	return confirmManyScript.EvalSha(ctx, pipe, []string{k.Meta, k.Grants, k.Deadlines}, confirmManyArgs(fence, grants)...)
}

// ParseConfirmMany reads the answer of a ConfirmManyCmd of n grants.
func ParseConfirmMany(cmd *redis.Cmd, n int) ([]ConfirmResult, []error, error) {
	res, err := cmd.Slice()
	if err != nil {
		return nil, nil, err
	}
	return parseConfirmMany(res, n)
}

func confirmManyArgs(fence bool, grants []ConfirmArg) []any {
	args := make([]any, 0, 1+3*len(grants))
	args = append(args, fenceFlag(fence))
	for _, g := range grants {
		args = append(args, g.User, g.Serial, g.Amount)
	}
	return args
}

func parseConfirmMany(res []any, n int) ([]ConfirmResult, []error, error) {
	if len(res) != n {
		return nil, nil, fmt.Errorf("confirm_many: %d answers for %d grants", len(res), n)
	}
	out, errs := make([]ConfirmResult, n), make([]error, n)
	for i, r := range res {
		one, _ := r.([]any)
		switch str(one, 0) {
		case "confirmed":
			out[i] = ConfirmResult{Confirmed, integer(one, 1)}
		case "already":
			out[i] = ConfirmResult{AlreadyConfirmed, integer(one, 1)}
		case "released":
			out[i].Result = WasReleased
		case "mismatch":
			out[i].Result = SerialMismatch
		case "unknown":
			out[i].Result = UnknownGrant
		case "amount":
			out[i] = ConfirmResult{AmountMismatch, integer(one, 1)}
		case "error":
			errs[i] = errors.New(str(one, 1))
		default:
			errs[i] = fmt.Errorf("confirm_many: unexpected answer %v", r)
		}
	}
	return out, errs, nil
}

// Released is what one release call did.
type Released struct {
	Count, Cents int64
	// OldestOverdueMS is how long past its deadline the oldest grant it
	// released was; 0 if it released none.
	OldestOverdueMS int64
	// More is true when the call stopped at its limit: more may be due.
	More bool
	// NextMS is how long until a grant of the sub-pool can next fall due.
	NextMS int64
	// Held is how many members the deadline index still has: 0 when no
	// grant is held there (a member may outlive the grants it names that
	// were confirmed, until its deadline).
	Held int64
}

// ReleaseExpired releases the grants of the sub-pool that are still held
// and past their deadline (by the shard's clock), looking at the users of
// due deadline index members until it has looked at limit (whole members:
// a member names up to a batch of claims): amounts back to the stock,
// grants marked released, counters, an outbox record each. Sent again, it
// releases nothing twice (what it released is no longer held).
func ReleaseExpired(ctx context.Context, c Client, k *rain.Keys, limit int) (Released, error) {
	res, err := releaseScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox, k.Batches}, limit).Slice()
	if err != nil {
		return Released{}, err
	}
	return Released{Count: integer(res, 0), Cents: integer(res, 1), OldestOverdueMS: integer(res, 2), More: integer(res, 3) == 1,
		NextMS: integer(res, 4), Held: integer(res, 5)}, nil
}

// Group is what EnsureGroup found of an outbox's consumer group.
type Group uint8

// EnsureGroup results.
const (
	GroupCreated Group = iota + 1 // created now
	GroupExists                   // there before
	GroupGone                     // the sub-pool is closed, or was never set up: nothing created
)

// EnsureGroup creates settlement's consumer group on the sub-pool's outbox
// unless it is there, or the sub-pool is closed (its tombstone) or was
// never set up (see group.lua): a settle worker that has not heard of a
// close creates no key of the closed pool.
func EnsureGroup(ctx context.Context, c Client, k *rain.Keys, group string) (Group, error) {
	res, err := groupScript.Run(ctx, c, []string{k.Meta, k.Outbox}, group).Slice()
	if err != nil {
		return 0, err
	}
	switch str(res, 0) {
	case "created":
		return GroupCreated, nil
	case "exists":
		return GroupExists, nil
	case "gone":
		return GroupGone, nil
	}
	return 0, fmt.Errorf("group: unexpected reply %v", res)
}

// Acknowledge acknowledges outbox entries in the consumer group and deletes
// them from the stream in one script (see acknowledge.lua), so that no
// crash leaves an entry acknowledged and still in the outbox, where it
// would keep the pool from closing.
func Acknowledge(ctx context.Context, c Client, outbox, group string, ids []string) error {
	args := make([]any, 0, 1+len(ids))
	args = append(args, group)
	for _, id := range ids {
		args = append(args, id)
	}
	return acknowledgeScript.Run(ctx, c, []string{outbox}, args...).Err()
}
