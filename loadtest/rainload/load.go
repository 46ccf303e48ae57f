package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"rain/loadtest/rainload/internal/schedule"
)

// runLoad is `rainload run`: preload, load, summary.
func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseLoad(args, stderr)
	if err != nil {
		return err
	}
	sched, err := schedule.New(cfg.startRate, cfg.stages)
	if err != nil {
		return err // parseLoad checked; kept for safety
	}
	var tl *os.File
	if cfg.timeline != "" {
		if tl, err = os.Create(cfg.timeline); err != nil {
			return err
		}
		defer tl.Close()
	}
	a := newAdmin(cfg, stderr)
	defer a.close()
	if cfg.preload {
		if err := a.preload(ctx); err != nil {
			return err
		}
	}

	var tlw io.Writer // not tl itself: a nil *os.File is a non-nil io.Writer
	if tl != nil {
		tlw = tl
	}
	sum, terr := load(ctx, cfg, sched, a, tlw, stderr)
	if terr != nil {
		terr = fmt.Errorf("timeline %s: %w", cfg.timeline, terr)
	}
	if tl != nil {
		if err := tl.Close(); err != nil && terr == nil {
			terr = fmt.Errorf("timeline %s: %w", cfg.timeline, err)
		}
	}
	sum.print(stdout)
	if cfg.summary != "" {
		b, err := json.MarshalIndent(sum, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.summary, append(b, '\n'), 0o644); err != nil {
			return errors.Join(fmt.Errorf("summary: %w", err), terr)
		}
	}
	return terr
}

// load runs the schedule against the target and returns the summary and the
// first error writing the timeline to tl (nil: no timeline). Its goroutines, in
// order of stopping: the scheduler (this one) when the schedule ends or ctx is
// done; the connections once they have drained the queue; the scraper; the
// monitor once it has written the last second.
func load(ctx context.Context, cfg *config, sched *schedule.Schedule, a *admin, tl io.Writer, stderr io.Writer) (*Summary, error) {
	d := newDriver(cfg)
	var scrapeAdmin *admin
	if cfg.scrape {
		scrapeAdmin = a
	}
	mon := newMonitor(d, scrapeAdmin, tl, stderr)
	d.start = time.Now()
	d.startConns()

	var scraper, monitor sync.WaitGroup
	scrapeCtx, stopScrape := context.WithCancel(context.Background())
	defer stopScrape()
	if scrapeAdmin != nil {
		scraper.Go(func() { scrapeAdmin.scrapeLoop(scrapeCtx) })
	}
	end := make(chan time.Duration, 1)
	var terr error
	monitor.Go(func() { terr = mon.run(end) })

	early := d.schedule(ctx, sched)
	schedLen := sched.Duration()
	if early {
		schedLen = min(time.Since(d.start), schedLen)
	}
	d.drain()
	finished := time.Since(d.start)
	stopScrape()
	scraper.Wait()
	if scrapeAdmin != nil {
		// One last look at the stock, after the last answer, for the last
		// samples.
		scrapeAdmin.scrape(context.Background())
	}
	end <- finished
	monitor.Wait()
	return d.summary(schedLen, finished, early, a.errs.Load()), terr
}
