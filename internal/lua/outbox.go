package lua

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// OutboxEntry is one grant or release of a sub-pool's outbox, as the
// scripts write it (prelude.lua: hold, release_held, write_books): a grant
// made, for settlement, or a held grant released at its deadline. A grant's
// entry is a field per value unless rain serve runs --outbox packed or
// batch (under batch one entry holds the grants of a batch); one a spill
// adopted always is a field per value; a release's is always packed.
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

// ParseOutboxEntry reads an outbox entry's values (XRANGE, XREADGROUP) of
// one grant or release: the packed form, one field g (a grant) or r (a
// release) holding "amount:serial:deadline_ms:user", and a field per value
// (type, pool, sub, user, amount, serial, deadline_ms, origin). On an
// error, Release still says whether the entry is a release. An entry of
// several grants (G) is an error here: ParseOutboxEntries reads every form.
func ParseOutboxEntry(v map[string]any) (OutboxEntry, error) {
	s := func(k string) string { x, _ := v[k].(string); return x }
	if g := s("g"); g != "" {
		return parsePacked(g, false)
	}
	if r := s("r"); r != "" {
		return parsePacked(r, true)
	}
	var e OutboxEntry
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

// ParseOutboxEntries reads an outbox entry's values in every form rain
// has written: the grants of one batch, one field G holding each grant's
// "amount:serial:deadline_ms:user" separated by spaces (an id holds none),
// or the one grant or release of any other form (ParseOutboxEntry). An
// entry of several grants is read whole or not at all; on an error,
// Release of the first entry still says whether the entry is a release.
func ParseOutboxEntries(v map[string]any) ([]OutboxEntry, error) {
	group, ok := v["G"].(string)
	if !ok {
		e, err := ParseOutboxEntry(v)
		return []OutboxEntry{e}, err
	}
	parts := strings.Split(group, " ")
	es := make([]OutboxEntry, len(parts))
	for i, part := range parts {
		e, err := parsePacked(part, false)
		if err != nil {
			return []OutboxEntry{{}}, fmt.Errorf("grant %d of %d: %w", i+1, len(parts), err)
		}
		es[i] = e
	}
	return es, nil
}

// parsePacked reads one packed "amount:serial:deadline_ms:user".
func parsePacked(packed string, release bool) (OutboxEntry, error) {
	e := OutboxEntry{Release: release} // an unreadable release is still one (it pays nothing)
	f := strings.SplitN(packed, ":", 4)
	if len(f) != 4 || f[3] == "" {
		return e, fmt.Errorf("outbox entry %q: want amount:serial:deadline_ms:user", packed)
	}
	e.User = f[3]
	return e, e.numbers(f[0], f[1], f[2])
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
