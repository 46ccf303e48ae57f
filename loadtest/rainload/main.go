// Command rainload is rain's open-loop HTTP load driver: it POSTs /grab at the
// arrival times of a constant or ramping rate, whatever the server's answers, and
// reports per-status counts, latency percentiles measured from when each request
// was due, and the arrivals it had to drop. scripts/bench.sh takes every figure it
// prints from it.
//
//	rainload [run] -pool P (-rate R -duration D | -stages S) [flags]   a load test
//	rainload fixed -listen 127.0.0.1:PORT                              a fixed-answer server
//	rainload report -o out.html [NAME=]timeline.jsonl ...              an HTML report
//
// A constant load of 5,000 grabs/s for 30 s, and a k6-style spike with the pool's
// gauges and stock scraped every second:
//
//	rainload -pool cny2027 -rate 5000 -duration 30s -summary s.json
//	rainload -pool cny2027 -stages 5s:1000,10s:8000,5s:8000,5s:0 \
//	    -admin-token T -scrape -preload 1000000:500000000 -timeline t.jsonl
//
// Open loop: request n is due at a time the schedule alone decides (package
// schedule), and goes out then if fewer than -max-inflight requests are in flight;
// otherwise it is dropped and counted, never queued for later. Latency runs from
// the due time, so a slow server cannot hide its slowness by slowing the driver
// down (no coordinated omission); the summary's "lag" shows how late the driver
// itself sent requests. Requests go out over at most -conns keep-alive
// connections, each owned by one goroutine with its own minimal HTTP/1.1 client
// (net/http parses the responses): net/http's Transport reaches about half the
// rate on a 2-core machine, and the driver must outrun rain by 2× there.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage:
  rainload [run] -pool P (-rate R -duration D | -stages S) [flags]   open-loop POST /grab load
  rainload fixed [-listen 127.0.0.1:8090]                             fixed-answer server (the driver's ceiling)
  rainload report -o out.html [-title T] [NAME=]timeline.jsonl ...   HTML charts of -timeline files
Run "rainload <command> -h" for a command's flags.`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "rainload:", err)
		os.Exit(1)
	}
}

// run is main without the process: it returns an error instead of exiting. A
// canceled ctx (Ctrl-C) ends a load test early; the summary is still written.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 && !isFlag(args[0]) {
		cmd, args = args[0], args[1:]
	}
	var err error
	switch cmd {
	case "run":
		err = runLoad(ctx, args, stdout, stderr)
	case "fixed":
		err = runFixed(ctx, args, stderr)
	case "report":
		err = runReport(args, stderr)
	case "help":
		fmt.Fprintln(stdout, usage)
		return nil
	default:
		fmt.Fprintln(stderr, usage)
		return fmt.Errorf("unknown command %q", cmd)
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h printed the flags
	}
	return err
}

func isFlag(s string) bool { return len(s) > 0 && s[0] == '-' }
