package catalog

// This file is what a catalog error tells a client, apart from what only
// the operator should read.

import (
	"errors"
	"fmt"
)

// code is the kind of a catalog error: the Err values are codes, and
// errors.Is matches them. Its text is what it says, to a client too.
type code struct{ text string }

func (c *code) Error() string { return "catalog: " + c.text }

// Error is a catalog error as a client is told it. Code is one of the Err
// values, which errors.Is matches; Reason is what a client reads (the HTTP
// API's "error": see ClientText), naming pools, sub-pools and shards by
// name, never by address; Err is the cause beneath, for logs and errors.Is
// only: a shard's error names its address, which is the operator's
// business, not a client's.
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

// errorf is an Error of code: the reason a client reads (format and args,
// which must name no address), and cause beneath it (nil for none).
func errorf(code, cause error, format string, args ...any) error {
	return &Error{Code: code, Reason: fmt.Sprintf(format, args...), Err: cause}
}

// readable is an Error of code whose cause a client may read whole: a
// spec's fault, told in its words.
func readable(code, err error) error {
	return &Error{Code: code, Reason: err.Error(), Err: err}
}

// ClientText is what a client is told of err: its code's text and its
// reason (for ErrNotNow the reason alone: it says why not), never its
// cause. "" when err is no catalog error.
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
