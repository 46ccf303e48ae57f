package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"rain/internal/wait/waittest"

	"github.com/chromedp/chromedp"
)

// TestDashboardInBrowser opens the dashboard in headless Chromium (the
// system's package; scripts/test.sh installs it) against `rain serve` on
// embedded shards, and checks what an operator sees: a wrong token is
// refused with an error, the right one opens the board (and is kept out of
// the URL), the grabs/s chart gets points while users grab, the pool's
// progress bar and numbers match GET /admin/pools/{id}, and the audit button
// reports the pool whole. It saves a screenshot (dashboard.png) in
// $RAIN_ARTIFACTS, or in the test's temporary directory. It fails, never
// skips, when Chromium cannot run.
func TestDashboardInBrowser(t *testing.T) {
	const token = "dash-token"
	addr, logs := startServe(t, []string{"--admin-token", token}, nil)
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", token, `{"pool_id":"cny","total_cents":5000000,"count":20000,"sub_pools":4}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 1100))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first call starts the browser: no timeout on it (a timeout would
	// stop the browser); the steps after it are bounded.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/admin/")); err != nil {
		t.Fatalf("headless Chromium could not open the dashboard (is the chromium package installed? scripts/test.sh installs it): %v\nrain logs:\n%s", err, logs)
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("`+sel+`").textContent`))
		must(t, err)
		return v
	}
	attr := func(sel, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.ID(sel), name))
		must(t, err)
		return v.Value
	}
	eval := func(js string) int {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		must(t, err)
		return v
	}

	// A wrong token: the form says so and the board stays hidden.
	must(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("login-error")),
	))
	if msg := text("login-error"); !strings.Contains(msg, "Wrong admin token") {
		t.Fatalf("a wrong token shows %q, want the wrong-token error", msg)
	}
	if shown := eval(`getComputedStyle(document.getElementById("board")).display === "none" ? 0 : 1`); shown != 0 {
		t.Fatal("the board shows before a right token was given")
	}

	// The right token opens the board; it is kept for the tab, not in the URL.
	must(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("board")),
		chromedp.WaitVisible(chromedp.CSS(`#pool-list button[data-pool="cny"]`)),
		chromedp.Click(chromedp.CSS(`#pool-list button[data-pool="cny"]`)),
		chromedp.WaitVisible(chromedp.ID("pool")),
	))
	url, err := chromedp.Run(ctx, chromedp.Location())
	must(t, err)
	kept, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("rain.adminToken")`))
	must(t, err)
	if strings.Contains(url, token) || kept != token {
		t.Fatalf("after login the URL is %q and the tab keeps %q: want the token kept for the tab and out of the URL", url, kept)
	}

	// Users grab for a few seconds; the grabs/s chart gets points with grants.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				post(t, base+"/grab", "", fmt.Sprintf(`{"pool_id":"cny","user_id":"w%d-%d"}`, w, i))
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	grantPoints := 0
	waittest.Until(t, 30*time.Second, "three points of grants on the chart", func() bool {
		grantPoints = eval(`points.filter(p => (p.grabs.granted || 0) > 0).length`)
		return grantPoints >= 3
	})
	close(stop)
	wg.Wait()
	if grantPoints < 3 {
		t.Fatalf("the grabs/s chart has %d points with grants after 30s of grabbing, want 3 or more", grantPoints)
	}
	if n, _ := strconv.Atoi(attr("chart-rate", "data-points")); n < 3 {
		t.Fatalf("the grabs/s chart drew %d points, want 3 or more", n)
	}

	// The progress bar and the numbers match the status endpoint (once the
	// page has refreshed after the last grab).
	st := status(t, base, token, "cny")
	if st.RemainingCount == st.Count {
		t.Fatal("no grab took stock")
	}
	want := strconv.FormatInt(st.RemainingCount, 10)
	waittest.Until(t, 10*time.Second, "the page showing the status endpoint's "+want+" packets remaining", func() bool {
		return attr("pool-bar", "data-remaining") == want
	})
	width, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("pool-bar").style.width`))
	must(t, err)
	pct, err := strconv.ParseFloat(strings.TrimSuffix(width, "%"), 64)
	if wantPct := 100 * float64(st.RemainingCount) / float64(st.Count); err != nil || math.Abs(pct-wantPct) > 0.01 {
		t.Fatalf("progress bar width %q, want %.2f%% (%d of %d)", width, wantPct, st.RemainingCount, st.Count)
	}
	wantText := fmt.Sprintf("%s of %s packets left", commas(st.RemainingCount), commas(st.Count))
	if line := text("pool-remaining"); !strings.Contains(line, wantText) {
		t.Fatalf("the pool's line reads %q, want it to say %q", line, wantText)
	}
	if rows := eval(`document.querySelectorAll("#sub-pools tbody tr").length`); rows != len(st.SubPools) {
		t.Fatalf("the page lists %d sub-pools, the pool has %d", rows, len(st.SubPools))
	}

	// The audit button reports the pool whole.
	eval(`document.getElementById("audit").click(), 0`)
	waittest.Until(t, 20*time.Second, "the audit's result on the page", func() bool {
		r := text("audit-result")
		return r != "" && r != "auditing…"
	})
	if ok := attr("audit-result", "data-ok"); ok != "true" {
		t.Fatalf("the audit button shows ok=%q (%s), want true", ok, text("audit-result"))
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	must(t, err)
	dir := os.Getenv("RAIN_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "dashboard.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))

	// The pool ends and closes (the in-process settlement confirms its
	// grants first); the page shows it closed, with its account: what was
	// left unclaimed as the packets left.
	if code, body := post(t, base+"/admin/pools/cny/end", token, ""); code != 200 {
		t.Fatalf("end = %d %v", code, body)
	}
	var account map[string]any
	waittest.Until(t, 30*time.Second, "the pool closes once settled", func() bool {
		code, body := post(t, base+"/admin/pools/cny/close", token, "")
		account = body
		return code == 200
	})
	unclaimed := fmt.Sprintf("%s of %s packets left", commas(int64(account["unclaimed_count"].(float64))), commas(st.Count))
	waittest.Until(t, 20*time.Second, "the page showing the pool closed, "+unclaimed, func() bool {
		return text("pool-state") == "closed" && strings.Contains(text("pool-remaining"), unclaimed)
	})
	if rows := eval(`document.querySelectorAll("#sub-pools tbody tr").length`); rows != len(st.SubPools) {
		t.Fatalf("the closed pool lists %d sub-pools, want its %d", rows, len(st.SubPools))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// poolStatus is what the test reads of GET /admin/pools/{id}.
type poolStatus struct {
	Count          int64             `json:"count"`
	RemainingCount int64             `json:"remaining_count"`
	SubPools       []json.RawMessage `json:"sub_pools"`
}

func status(t *testing.T, base, token, pool string) poolStatus {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/admin/pools/"+pool, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st poolStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("status = %d, %v", resp.StatusCode, err)
	}
	return st
}

// commas formats n as the page does (en-US grouping).
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
