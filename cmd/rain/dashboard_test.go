package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"rain/internal/wait/waittest"

	"github.com/chromedp/chromedp"
)

// TestDashboardInBrowser opens the dashboard in headless Chromium against
// `rain serve` on embedded shards, and checks what an operator watching a
// rain sees: a wrong token is refused with an error, the right one opens
// the board (and is kept out of the URL), the grabs/s chart gets points
// while users grab, the pool's progress bar and numbers match
// GET /admin/pools/{id}, the audit button reports the pool whole, and a
// pool closed elsewhere shows its account. It saves a screenshot
// (dashboard.png) in $RAIN_ARTIFACTS, or in the test's temporary
// directory. The operator's actions are TestConsoleInBrowser's.
func TestDashboardInBrowser(t *testing.T) {
	const token = "dash-token"
	addr, logs := startServe(t, []string{"--admin-token", token}, nil)
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", token, `{"pool_id":"cny","total_cents":5000000,"count":20000,"sub_pools":4}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	b := openBrowser(t, base+"/admin/", 90*time.Second, logs)

	// A wrong token: the form says so and the board stays hidden.
	b.do(
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("login-error")),
	)
	if msg := b.text("login-error"); !strings.Contains(msg, "Wrong admin token") {
		t.Fatalf("a wrong token shows %q, want the wrong-token error", msg)
	}
	if b.shown("board") {
		t.Fatal("the board shows before a right token was given")
	}

	// The right token opens the board; it is kept for the tab, not in the URL.
	b.do(
		chromedp.SendKeys(chromedp.ID("token"), token),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("board")),
		chromedp.WaitVisible(chromedp.CSS(`#pool-table tr[data-pool="cny"] button`)),
		chromedp.Click(chromedp.CSS(`#pool-table tr[data-pool="cny"] button`)),
		chromedp.WaitVisible(chromedp.ID("pool")),
	)
	url, err := chromedp.Run(b.ctx, chromedp.Location())
	must(t, err)
	if kept := b.str(`sessionStorage.getItem("rain.adminToken")`); strings.Contains(url, token) || kept != token {
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
		grantPoints = b.num(`points.filter(p => (p.grabs.granted || 0) > 0).length`)
		return grantPoints >= 3
	})
	close(stop)
	wg.Wait()
	if n, _ := strconv.Atoi(b.attr("chart-rate", "data-points")); n < 3 {
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
		return b.attr("pool-bar", "data-remaining") == want
	})
	width := b.str(`document.getElementById("pool-bar").style.width`)
	pct, err := strconv.ParseFloat(strings.TrimSuffix(width, "%"), 64)
	if wantPct := 100 * float64(st.RemainingCount) / float64(st.Count); err != nil || math.Abs(pct-wantPct) > 0.01 {
		t.Fatalf("progress bar width %q, want %.2f%% (%d of %d)", width, wantPct, st.RemainingCount, st.Count)
	}
	wantText := fmt.Sprintf("%s of %s packets left", commas(st.RemainingCount), commas(st.Count))
	if line := b.text("pool-remaining"); !strings.Contains(line, wantText) {
		t.Fatalf("the pool's line reads %q, want it to say %q", line, wantText)
	}
	if rows := b.num(`document.querySelectorAll("#sub-pools tbody tr").length`); rows != len(st.SubPools) {
		t.Fatalf("the page lists %d sub-pools, the pool has %d", rows, len(st.SubPools))
	}

	// The audit button reports the pool whole.
	b.click("audit")
	waittest.Until(t, 20*time.Second, "the audit's result on the page", func() bool {
		r := b.text("audit-result")
		return r != "" && r != "auditing…"
	})
	if ok := b.attr("audit-result", "data-ok"); ok != "true" {
		t.Fatalf("the audit button shows ok=%q (%s), want true", ok, b.text("audit-result"))
	}
	b.shot("dashboard.png")

	// The pool ends and closes through the API (the in-process settlement
	// confirms its grants first); the page shows it closed, with its
	// account.
	if code, body := post(t, base+"/admin/pools/cny/end", token, ""); code != 200 {
		t.Fatalf("end = %d %v", code, body)
	}
	var account map[string]any
	waittest.Until(t, 30*time.Second, "the pool closes once settled", func() bool {
		code, body := post(t, base+"/admin/pools/cny/close", token, "")
		account = body
		return code == 200
	})
	unclaimed := commas(int64(account["unclaimed_count"].(float64)))
	waittest.Until(t, 20*time.Second, "the page showing the pool closed, "+unclaimed+" unclaimed", func() bool {
		return b.text("pool-state") == "closed" && b.text("a-unclaimed-count") == unclaimed
	})
	if rows := b.num(`document.querySelectorAll("#account-subs tbody tr").length`); rows != len(st.SubPools) {
		t.Fatalf("the closed pool's account lists %d sub-pools, want its %d", rows, len(st.SubPools))
	}
	b.noProblems()
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
