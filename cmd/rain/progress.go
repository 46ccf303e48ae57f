package main

// This file shows a big preload's progress: a bar on a terminal, plain
// lines (every tenth) otherwise.

import (
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressFrom is the smallest pool whose preload shows its progress.
const progressFrom = 100_000

// preloadProgress returns the progress callback of a preload of count
// packets written to w, and finish, to call when the preload returns. Small
// pools show nothing.
func preloadProgress(w io.Writer, pool string, count int64) (progress func(loaded, total int64), finish func()) {
	if count < progressFrom {
		return nil, func() {}
	}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions64(count,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("preload "+pool),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("packets"),
			progressbar.OptionThrottle(100_000_000), // 100 ms
			progressbar.OptionClearOnFinish(),
		)
		return func(loaded, _ int64) { _ = bar.Set64(loaded) }, func() { _ = bar.Finish() }
	}
	lastTenth := int64(-1)
	return func(loaded, total int64) {
		if tenth := loaded * 10 / total; tenth > lastTenth {
			lastTenth = tenth
			fmt.Fprintf(w, "preload %s: %d%% (%d of %d packets)\n", pool, tenth*10, loaded, total)
		}
	}, func() {}
}
