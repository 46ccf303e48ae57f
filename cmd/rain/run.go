package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
)

const usage = `usage: rain <command> [flags]

commands:
  serve     run the service (POST /grab and the operator API)
  preload   load a pool of red packets
  audit     check a pool's conservation; exits non-zero on a problem
  end       end a pool now: every grab answers ended
  close     close a pool whose life is over: its account recorded, its keys freed;
            exits non-zero, with the reasons, while it cannot close yet
  settle    confirm grants and hand them to the system of record (PostgreSQL,
            a ledger file or a webhook)
  version   print rain's version (also --version)

Every flag can also be set by the environment variable named in its help.
Run "rain <command> -h" for a command's flags.

` + exitCodes

// run is main without the process: it returns an error instead of exiting.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return usagef("no command given")
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], getenv, stderr)
	case "preload":
		err = preload(ctx, args[1:], getenv, stdout, stderr)
	case "audit":
		err = audit(ctx, args[1:], getenv, stdout, stderr)
	case "end", "close":
		err = life(ctx, args[0], args[1:], getenv, stdout, stderr)
	case "settle":
		err = settleCmd(ctx, args[1:], getenv, stderr)
	case "version", "--version", "-version":
		b := buildInfo()
		fmt.Fprintf(stdout, "rain %s %s %s\n", b.Version, b.Revision, runtime.Version())
		return nil
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return usagef("unknown command %q", args[0])
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h printed the flags
	}
	return err
}
