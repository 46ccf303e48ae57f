package lua

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// OutboxEntry is one entry of a sub-pool's outbox, as the scripts write it
// (prelude.lua: hold, release_held): a grant made, for settlement, or a
// held grant released at its deadline. A grant's entry is a field per
// value unless rain serve runs --outbox packed (one spill adopted always
// is); a release's is always packed.
type OutboxEntry struct {
	Release    bool // a release; else a grant made
	User       string
	Amount     int64 // cents
	Serial     int64
	DeadlineMS int64
	// Origin is, for a grant adopted by a spill, the sibling sub-pool its
	// amount came from ("" otherwise).
	Origin string
	// Pool and Sub name the sub-pool when the entry does (a field per
	// value); Pool is "" for a packed entry, whose sub-pool is its
	// stream's (rain.ParseOutbox).
	Pool string
	Sub  int
}

// ParseOutboxEntry reads an outbox entry's values (XRANGE, XREADGROUP):
// the packed form, one field g (a grant) or r (a release) holding
// "amount:serial:deadline_ms:user", and a field per value (type, pool,
// sub, user, amount, serial, deadline_ms, origin): every form rain has
// written. On an error, Release still says
// whether the entry is a release.
func ParseOutboxEntry(v map[string]any) (OutboxEntry, error) {
	s := func(k string) string { x, _ := v[k].(string); return x }
	var e OutboxEntry
	packed, release := s("g"), false
	if packed == "" {
		packed, release = s("r"), true
	}
	if packed != "" {
		e.Release = release // an unreadable release is still one (it pays nothing)
		f := strings.SplitN(packed, ":", 4)
		if len(f) != 4 || f[3] == "" {
			return e, fmt.Errorf("outbox entry %q: want amount:serial:deadline_ms:user", packed)
		}
		e.User = f[3]
		return e, e.numbers(f[0], f[1], f[2])
	}
	switch s("type") {
	case "grant":
	case "release":
		e.Release = true
	default:
		return e, errors.New("outbox entry of no known form")
	}
	e.User, e.Origin, e.Pool = s("user"), s("origin"), s("pool")
	sub, err := strconv.Atoi(s("sub"))
	if err != nil {
		return e, fmt.Errorf("sub: %w", err)
	}
	e.Sub = sub
	return e, e.numbers(s("amount"), s("serial"), s("deadline_ms"))
}

// numbers sets e's amount, serial and deadline from their digits.
func (e *OutboxEntry) numbers(amount, serial, deadline string) error {
	var err error
	if e.Amount, err = strconv.ParseInt(amount, 10, 64); err != nil {
		return fmt.Errorf("amount: %w", err)
	}
	if e.Serial, err = strconv.ParseInt(serial, 10, 64); err != nil {
		return fmt.Errorf("serial: %w", err)
	}
	if e.DeadlineMS, err = strconv.ParseInt(deadline, 10, 64); err != nil {
		return fmt.Errorf("deadline_ms: %w", err)
	}
	return nil
}
