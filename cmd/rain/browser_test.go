package main

// This file is what the browser tests of the dashboard share: rain serve on
// port 0, headless Chromium on its page, and the screenshots.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"rain/internal/logtest"
)

// browser is headless Chromium on one tab, and what went wrong in the
// page: uncaught exceptions, and what the browser logged as a security
// error (a resource the page's CSP refused).
type browser struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex // guards problems
	problems []string
}

// openBrowser starts headless Chromium (the system's package;
// scripts/test.sh installs it) on url. It fails, never skips, when
// Chromium cannot run. Every step after the start is bounded by within.
func openBrowser(t *testing.T, url string, within time.Duration, logs *logtest.Buffer) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	b := &browser{t: t}
	// The first call starts the browser: no timeout on it (a timeout would
	// stop the browser); the steps after it are bounded.
	if err := chromedp.Listen(ctx, b.watch); err != nil {
		t.Fatalf("headless Chromium did not start (is the chromium package installed? scripts/test.sh installs it): %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("headless Chromium could not open %s: %v\nrain logs:\n%s", url, err, logs)
	}
	var cancel context.CancelFunc
	b.ctx, cancel = context.WithTimeout(ctx, within)
	t.Cleanup(cancel)
	return b
}

// watch keeps what went wrong in the page (it runs on the tab's reading
// goroutine: it only appends).
func (b *browser) watch(ev any) {
	var problem string
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		problem = "uncaught: " + ev.ExceptionDetails.Text
		if ex := ev.ExceptionDetails.Exception; ex != nil {
			problem += " " + ex.Description
		}
	case *log.EventEntryAdded:
		if ev.Entry.Source == log.EntrySourceSecurity {
			problem = "security: " + ev.Entry.Text
		}
	}
	if problem != "" {
		b.mu.Lock()
		b.problems = append(b.problems, problem)
		b.mu.Unlock()
	}
}

// noProblems fails the test when the page threw or broke its CSP.
func (b *browser) noProblems() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) > 0 {
		b.t.Fatalf("the page went wrong:\n%s", strings.Join(b.problems, "\n"))
	}
}

func (b *browser) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	must(b.t, chromedp.Do(b.ctx, steps...))
}

// text is the text of the element with this id.
func (b *browser) text(id string) string {
	b.t.Helper()
	return b.str(`document.getElementById("` + id + `").textContent`)
}

// str evaluates js in the page: a string.
func (b *browser) str(js string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](js))
	must(b.t, err)
	return v
}

// num evaluates js in the page: an int.
func (b *browser) num(js string) int {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[int](js))
	must(b.t, err)
	return v
}

func (b *browser) attr(id, name string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.AttributeValue(chromedp.ID(id), name))
	must(b.t, err)
	return v.Value
}

// shown reports whether the element with this id is displayed.
func (b *browser) shown(id string) bool {
	b.t.Helper()
	return b.num(`(e => e && getComputedStyle(e).display !== "none" && !e.closest("[hidden]") ? 1 : 0)(document.getElementById("`+id+`"))`) == 1
}

// fill sets a form field's value and tells the page, as typing does.
func (b *browser) fill(id, value string) {
	b.t.Helper()
	b.do(chromedp.SetValue(chromedp.ID(id), value))
	b.num(`document.getElementById("` + id + `").dispatchEvent(new Event("input", {bubbles: true})), 0`)
}

// click clicks the element with this id (through the page: the element
// may be under the dialog's backdrop for a moment).
func (b *browser) click(id string) {
	b.t.Helper()
	b.num(`document.getElementById("` + id + `").click(), 0`)
}

// shot saves a screenshot of the whole page as name in $RAIN_ARTIFACTS (or
// in the test's temporary directory).
func (b *browser) shot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	must(b.t, err)
	b.save(name, png)
}

// shotOf saves a screenshot of the first element css selects.
func (b *browser) shotOf(css, name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.Screenshot(chromedp.CSS(css)))
	must(b.t, err)
	b.save(name, png)
}

func (b *browser) save(name string, png []byte) {
	b.t.Helper()
	dir := os.Getenv("RAIN_ARTIFACTS")
	if dir == "" {
		dir = b.t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s (%d bytes)", path, len(png))
}
