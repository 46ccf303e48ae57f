// Command rain is the red-packet rain backend: `rain serve` runs the service;
// `rain preload` and `rain audit` are the operator's tools. See the README.
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
		os.Exit(1)
	}
}
