// Command rain is the red-packet rain backend: `rain serve` runs the service;
// `rain preload`, `rain audit`, `rain end`, `rain close` and `rain settle`
// are the operator's tools. See docs/operations.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rain:", err)
	}
	os.Exit(exitCode(err)) // see exit.go
}
