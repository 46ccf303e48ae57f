package main

// This file is rain's exit codes: what a script calling a command can tell
// apart without reading its message.

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"rain"
	"rain/internal/shard"
)

// Exit codes.
const (
	exitOK          = 0 // the work was done
	exitFailed      = 1 // the work failed: an audit found problems, a pool cannot close yet, ...
	exitUsage       = 2 // the command line or the environment is wrong: nothing was tried
	exitUnreachable = 3 // a shard, the database or the login service's key set could not be reached
)

// exitCodes is what `rain -h` says of them.
const exitCodes = `exit codes:
  0  done
  1  the work failed (an audit found problems, a pool cannot close yet, ...)
  2  usage: a flag, an argument or an environment variable is wrong; nothing was tried
  3  a shard, the database or the login service's key set (--user-auth jwks-url) could not be reached`

// usageError is an error of the command line or the environment.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef is a usageError made as fmt.Errorf makes an error.
func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// asUsage marks err, when not nil, as an error of the command line.
func asUsage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// exitCode is the code rain exits with after err.
func exitCode(err error) int {
	var u usageError
	var pgConnect *pgconn.ConnectError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &u):
		return exitUsage
	case errors.Is(err, rain.ErrUnavailable), shard.Unreachable(err), errors.As(err, &pgConnect):
		return exitUnreachable
	}
	return exitFailed
}
