package rain

// This file is rain's error codes, and what an error tells a client apart
// from what only the operator should read.

import (
	"errors"
	"fmt"
)

// Error codes callers match with errors.Is; the HTTP layer (internal/api)
// turns them into status codes, in one place. The catalogue
// (internal/catalog) returns them, and each reads "catalog: ...", as it
// always has; a client is told the text after that prefix, with the reason
// of the Error that carries it (ClientText).
var (
	// ErrInvalid wraps the reason a request or spec is refused (HTTP 400).
	ErrInvalid error = &code{"invalid"}
	// ErrConflict is returned when a pool id exists with a different spec.
	ErrConflict error = &code{"pool exists with a different spec"}
	// ErrNotFound is returned for a pool that does not exist.
	ErrNotFound error = &code{"no such pool"}
	// ErrUnavailable is returned when a shard does not answer: nothing the
	// call would have written was written, or what was is finished by
	// running the same call again.
	ErrUnavailable error = &code{"unavailable"}
	// ErrGrantReleased is returned by a confirm when the grant was released
	// at its deadline before it was confirmed: its amount is back in the
	// stock.
	ErrGrantReleased error = &code{"grant was released"}
	// ErrSerialMismatch is returned by a confirm when the user's grant has
	// another serial.
	ErrSerialMismatch error = &code{"serial does not match the user's grant"}
	// ErrNoGrant is returned by a confirm when the user holds no grant in
	// the pool.
	ErrNoGrant error = &code{"no such grant"}
	// ErrNotNow wraps why a pool cannot do what was asked in the state it
	// is in: a close before the pool has ended, while grants are held or
	// unsettled, with the audit's or the books' differences; an end before
	// it has loaded. Nothing was changed (HTTP 409).
	ErrNotNow error = &code{"not now"}
	// ErrPartial is returned by a read of the pool registries, with the ids
	// it read, when some shards did not answer: those the others hold.
	ErrPartial error = &code{"some shards did not answer"}
)

// code is the kind of an error: the Err values are codes, and errors.Is
// matches them. Its text is what it says, to a client too.
type code struct{ text string }

func (c *code) Error() string { return "catalog: " + c.text }

// Error is an error as a client is told it. Code is one of the Err values,
// which errors.Is matches; Reason is what a client reads (the HTTP API's
// "error": see ClientText), naming pools, sub-pools and shards by name,
// never by address; Err is the cause beneath, for logs and errors.Is only:
// a shard's error names its address, which is the operator's business, not
// a client's.
type Error struct {
	Code   error
	Reason string
	Err    error
}

func (e *Error) Error() string {
	msg := e.Code.Error()
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil && e.Err.Error() != e.Reason {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() []error {
	if e.Err == nil {
		return []error{e.Code}
	}
	return []error{e.Code, e.Err}
}

// Errorf is an Error of code: the reason a client reads (format and args,
// which must name no address), and cause beneath it (nil for none).
func Errorf(code, cause error, format string, args ...any) error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...), Err: cause}
}

// readable is an Error of code whose cause a client may read whole: a
// spec's fault, told in its words.
func readable(code, err error) error {
	return &Error{Code: code, Reason: err.Error(), Err: err}
}

// ClientText is what a client is told of err: its code's text and its
// reason (for ErrNotNow the reason alone: it says why not), never its
// cause. "" when err carries no code.
func ClientText(err error) string {
	var e *Error
	if errors.As(err, &e) {
		c, _ := e.Code.(*code)
		switch {
		case c == nil:
			return e.Reason
		case e.Reason == "":
			return c.text
		case e.Code == ErrNotNow:
			return e.Reason
		}
		return c.text + ": " + e.Reason
	}
	var c *code
	if errors.As(err, &c) {
		return c.text
	}
	return ""
}
