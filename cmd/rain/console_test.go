package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"

	"rain/internal/logtest"
	"rain/internal/lua"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestConsoleInBrowser walks a pool's whole life from the operator's
// console in headless Chromium, against rain serve on two real shards
// (the second behind a proxy that can cut it off) and, later, rain settle:
//
//   - rain's address opened in a browser leads to the console;
//   - a wrong token shows an error, not a blank page;
//   - an amount with three decimals is caught by the page; a spec the
//     server refuses shows the server's own reason beside the field it
//     names, and nothing is created;
//   - the preview shows the split before it is sent; times are entered in
//     the browser's time zone (Asia/Shanghai here) and sent in UTC;
//   - a preload that dies midway (the shard cut off after 20 load
//     batches) shows the pool loading, with the packets loaded as the
//     status endpoint counts them; Finish loading completes it and the
//     page watches it open;
//   - users grab through the API; End, confirmed in a dialog that names
//     the pool and what will happen, ends it;
//   - Close is refused (409) while grants are held and unsettled, and the
//     page lists each reason the API gave, in words;
//   - once rain settle has run, Close records the account: the page shows
//     what GET /admin/pools/{id} answers, and its CSV download says the
//     same;
//   - the list shows closed pools with their accounts beside live ones,
//     filtered by state and by id.
//
// A screenshot of each state lands in $RAIN_ARTIFACTS (console-*.png), and
// the page must throw nothing and break no CSP rule throughout.
func TestConsoleInBrowser(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	proxy := redisproxy.Start(t, servers[1].Addr)
	environ := map[string]string{
		"RAIN_REDIS":       fmt.Sprintf("a=1@%s,b=1@%s", servers[0].Addr, proxy.Addr),
		"RAIN_ADMIN_TOKEN": longToken,
	}
	addr, logs := startServe(t, nil, environ)
	base := "http://" + addr
	checkRoot(t, base)

	// rain's address leads to the console.
	b := openBrowser(t, base+"/", 3*time.Minute, logs)
	_, err := chromedp.Call(b.ctx, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Asia/Shanghai"})
	must(t, err)
	if url, err := chromedp.Run(b.ctx, chromedp.Location()); err != nil || url != base+"/admin/" {
		t.Fatalf("opening %s/ in a browser lands on %q (%v), want the console at %s/admin/", base, url, err, base)
	}

	// A wrong token: an error, the board hidden.
	b.do(chromedp.WaitVisible(chromedp.ID("token")), chromedp.SendKeys(chromedp.ID("token"), "not-the-token"),
		chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)), chromedp.WaitVisible(chromedp.ID("login-error")))
	if msg := b.text("login-error"); !strings.Contains(msg, "Wrong admin token") || b.shown("board") {
		t.Fatalf("a wrong token shows %q (board shown: %v), want the wrong-token error and no board", msg, b.shown("board"))
	}
	b.shot("console-login-refused.png")
	b.do(chromedp.SendKeys(chromedp.ID("token"), longToken), chromedp.Click(chromedp.CSS(`#token-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("preload-form")))

	// Yuan become integer cents exactly, or an error that says why.
	for in, want := range map[string]string{"0.01": "1", "0.1": "10", "12": "1200", "5,000.50": "500050", "19.99": "1999",
		"9999999999999.99": "999999999999999", "": "null", "1.234": "error", "1e3": "error", "-1": "error", "¥5": "error", "99999999999999": "error"} {
		if got := b.str(`(() => { try { return String(centsOf(` + strconv.Quote(in) + `)) } catch (e) { return "error" } })()`); got != want {
			t.Errorf("centsOf(%q) = %s, want %s", in, got, want)
		}
	}
	// An amount in tenths of cents never leaves the page.
	b.fill("f-pool", "tiny")
	b.fill("f-total", "1.234")
	b.fill("f-count", "10")
	b.click("preload-submit")
	if e := b.text("e-total_cents"); !strings.Contains(e, "two decimals") {
		t.Fatalf("a total of 1.234 yuan shows %q beside the total, want it to ask for two decimals", e)
	}
	// A spec the server refuses: its reason, beside the field it names.
	b.fill("f-total", "0.05")
	if b.attr("preview", "data-possible") != "false" {
		t.Fatalf("the preview of 10 packets in 0.05 yuan reads %q, want it to say the spec cannot be met", b.text("preview"))
	}
	code, refusal := post(t, base+"/admin/pools", longToken, `{"pool_id":"tiny","total_cents":5,"count":10}`)
	if code != 400 {
		t.Fatalf("preload of 10 packets in 5 cents = %d %v, want 400", code, refusal)
	}
	b.click("preload-submit")
	waittest.Until(t, 20*time.Second, "the server's reason beside the total", func() bool { return b.text("e-total_cents") != "" })
	if got := b.text("e-total_cents"); got != refusal["error"] {
		t.Fatalf("beside the total the page shows %q, want the server's reason %q", got, refusal["error"])
	}
	b.shot("console-bad-entry.png")

	// The preview of the pool to load; its end in Shanghai time, sent in UTC.
	b.fill("f-pool", "cny")
	b.fill("f-total", "50,000.00")
	b.fill("f-count", "100000")
	b.fill("f-subs", "2")
	b.fill("f-ends", "2030-01-02T03:04:05")
	preview := b.text("preview")
	for _, want := range []string{"100,000 packets", "¥50,000.00 in all", "¥0.50 on average", "between ¥0.01 and ¥49,000.01", "2 sub-pool"} {
		if !strings.Contains(preview, want) {
			t.Fatalf("the preview reads %q, want it to say %q", preview, want)
		}
	}
	if u := b.text("u-ends"); u != "sent as 2030-01-01T19:04:05Z" {
		t.Fatalf("03:04:05 on 2 January 2030 in Shanghai is shown %q, want it sent as 2030-01-01T19:04:05Z", u)
	}
	b.shot("console-preview.png")

	// The preload dies midway: shard b is cut off after its 20th load batch.
	proxy.PartitionAfter(redisproxy.Script(lua.SHA("load")), 20, nil)
	b.click("preload-submit")
	waittest.Until(t, 30*time.Second, "the page saying the preload stopped", func() bool {
		return strings.Contains(b.text("preload-result"), "stopped")
	})
	proxy.Heal()
	var st map[string]any
	waittest.Until(t, 30*time.Second, "the page showing the pool loading as its status does", func() bool {
		st = getJSON(t, base, "/admin/pools/cny")
		return st["state"] == "loading" && b.text("pool-state") == "loading" && b.shown("resume") &&
			b.attr("pool-bar", "data-remaining") == fmt.Sprint(st["remaining_count"])
	})
	loaded := int64(st["remaining_count"].(float64))
	if want := fmt.Sprintf("Loading: %s of 100,000 packets loaded", commas(loaded)); loaded >= 100000 || !strings.HasPrefix(b.text("pool-remaining"), want) {
		t.Fatalf("the stopped preload shows %q, want %q (and fewer than all)", b.text("pool-remaining"), want)
	}
	b.shot("console-loading.png")
	b.click("resume")
	waittest.Until(t, 60*time.Second, "the page watching the pool open", func() bool {
		return b.text("pool-state") == "open" && b.attr("pool-bar", "data-remaining") == "100000"
	})
	st = getJSON(t, base, "/admin/pools/cny")
	if spec := st["spec"].(map[string]any); st["state"] != "open" || spec["ends_at"] != "2030-01-01T19:04:05Z" || spec["total_cents"] != 5e6 {
		t.Fatalf("the pool loaded from the page: %v, want it open, 5000000 cents, ending 2030-01-01T19:04:05Z", st)
	}
	b.shot("console-open.png")

	// Users grab through the API (shard b's breaker may still be opening
	// again after the cut: a 503 is tried again).
	granted := map[string]bool{}
	waittest.Until(t, 30*time.Second, "40 users granted", func() bool {
		for i := range 40 {
			u := fmt.Sprintf("u%d", i)
			if code, _ := post(t, base+"/grab", "", `{"pool_id":"cny","user_id":"`+u+`"}`); code == 200 {
				granted[u] = true
			}
		}
		return len(granted) == 40
	})

	// End, after a confirmation naming the pool and what will happen.
	waittest.Until(t, 10*time.Second, "the page showing the 40 grants held", func() bool { return b.text("held-count") == "40" })
	b.click("end")
	waittest.Until(t, 10*time.Second, "the confirmation", func() bool { return b.shown("confirm") })
	if text := b.text("confirm-text"); !strings.Contains(b.text("confirm-title"), "cny") || !strings.Contains(text, `answered "ended"`) || !strings.Contains(text, "40 grant(s) held") {
		t.Fatalf("the end's confirmation says %q / %q, want it to name cny, the grabs answered ended and the 40 grants held", b.text("confirm-title"), text)
	}
	b.shot("console-end-confirm.png")
	b.click("confirm-ok")
	waittest.Until(t, 20*time.Second, "the page showing the pool ended", func() bool { return b.text("pool-state") == "ended" })

	// Close is refused while the grants are held: each reason, in words.
	b.click("close")
	waittest.Until(t, 10*time.Second, "the confirmation", func() bool { return b.shown("confirm") })
	if text := b.text("confirm-text"); !strings.Contains(b.text("confirm-title"), "cny") || !strings.Contains(text, "frees the pool's keys") || !strings.Contains(text, "cannot be opened again") {
		t.Fatalf("the close's confirmation says %q, want it to name cny and say what a close does", text)
	}
	b.click("confirm-ok")
	waittest.Until(t, 20*time.Second, "the close's refusal on the page", func() bool { return b.attr("action-result", "data-code") == "409" })
	code, refusal = post(t, base+"/admin/pools/cny/close", longToken, "")
	reasons := strings.Split(strings.SplitN(fmt.Sprint(refusal["error"]), "cannot close: ", 2)[1], "; ")
	shown := b.str(`[...document.querySelectorAll("#refusal li")].map(li => li.dataset.reason).join("; ")`)
	words := b.str(`[...document.querySelectorAll("#refusal li")].map(li => li.textContent).join("\n")`)
	if code != 409 || shown != strings.Join(reasons, "; ") || !strings.Contains(words, "still holds") || strings.Contains(words, "grants held") {
		t.Fatalf("the page lists %q as\n%s\nwant the API's reasons %q (409), each in words", shown, words, refusal["error"])
	}
	b.shot("console-close-refused.png")

	// Settlement runs; then the close records the account.
	startSettle(t, environ)
	waittest.Until(t, 60*time.Second, "the page closing the pool once settled", func() bool {
		if st := getJSON(t, base, "/admin/pools/cny"); st["held_count"] != 0.0 {
			return false
		}
		b.num(`delete document.getElementById("action-result").dataset.code, 0`)
		b.click("close")
		waittest.Until(t, 10*time.Second, "the confirmation", func() bool { return b.shown("confirm") })
		b.click("confirm-ok")
		waittest.Until(t, 20*time.Second, "the close's answer", func() bool { return b.attr("action-result", "data-code") != "" })
		return b.attr("action-result", "data-code") == "200"
	})
	account := getJSON(t, base, "/admin/pools/cny")
	waittest.Until(t, 10*time.Second, "the account on the page", func() bool { return b.shown("account-view") })
	for _, k := range []string{"preloaded", "confirmed", "unclaimed"} {
		for _, unit := range []string{"count", "cents"} {
			if got, want := b.text("a-"+k+"-"+unit), commas(int64(account[k+"_"+unit].(float64))); got != want {
				t.Errorf("the page's account says %s %s %s, GET /admin/pools/cny says %s", k, unit, got, want)
			}
		}
	}
	subs := account["sub_pools"].([]any)
	var rows []string
	for _, sp := range subs {
		m := sp.(map[string]any)
		rows = append(rows, fmt.Sprintf("%v|%s|%s|%s|%s", m["index"], commas(int64(m["confirmed_count"].(float64))), commas(int64(m["confirmed_cents"].(float64))),
			commas(int64(m["unclaimed_count"].(float64))), commas(int64(m["unclaimed_cents"].(float64)))))
	}
	if got := b.str(`[...document.querySelectorAll("#account-subs tbody tr")].map(tr => [...tr.cells].map(c => c.textContent).join("|")).join("\n")`); got != strings.Join(rows, "\n") {
		t.Fatalf("the page's account by sub-pool:\n%s\nwant, as GET /admin/pools/cny says:\n%s", got, strings.Join(rows, "\n"))
	}
	if account["confirmed_count"] != 40.0 || account["preloaded_count"] != 1e5 {
		t.Fatalf("account %v, want 100000 preloaded and 40 confirmed", account)
	}
	b.shot("console-closed.png")
	b.shotOf(".console", "console-account.png") // docs/console.md's picture (docs/console.png)

	// The account as CSV, downloaded as a browser does.
	dir := t.TempDir()
	_, err = chromedp.CallBrowser(b.ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
		Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dir})
	must(t, err)
	b.click("csv")
	var csv []byte
	want := accountCSV(account)
	waittest.Until(t, 20*time.Second, "cny-account.csv downloaded whole", func() bool {
		// The browser may create the file before it has written it all.
		csv, err = os.ReadFile(filepath.Join(dir, "cny-account.csv"))
		return err == nil && len(csv) >= len(want)
	})
	if string(csv) != want {
		t.Fatalf("the downloaded account:\n%s\nwant:\n%s", csv, want)
	}

	// Closed pools stay listed with their accounts, beside live ones; the
	// list filters by state and by id.
	if code, body := post(t, base+"/admin/pools", longToken, `{"pool_id":"other","total_cents":1000,"count":10}`); code != 201 {
		t.Fatalf("preload of other = %d %v", code, body)
	}
	visible := func() string {
		return b.str(`[...document.querySelectorAll("#pool-table tbody tr")].filter(tr => !tr.hidden).map(tr => tr.dataset.pool + ":" + tr.dataset.state).join(" ")`)
	}
	waittest.Until(t, 20*time.Second, "both pools listed", func() bool { return visible() == "cny:closed other:open" })
	if row := b.str(`document.querySelector('#pool-table tr[data-pool="cny"]').textContent`); !strings.Contains(row, "40 confirmed · 99,960 unclaimed") {
		t.Fatalf("the closed pool's row reads %q, want its account", row)
	}
	b.do(chromedp.SetValue(chromedp.ID("state-filter"), "closed"))
	b.num(`document.getElementById("state-filter").dispatchEvent(new Event("change")), 0`)
	if v := visible(); v != "cny:closed" {
		t.Fatalf("filtered to closed pools, the list shows %q", v)
	}
	b.shot("console-pools-closed.png")
	b.do(chromedp.SetValue(chromedp.ID("state-filter"), ""))
	b.num(`document.getElementById("state-filter").dispatchEvent(new Event("change")), 0`)
	b.fill("pool-filter", "oth")
	if v := visible(); v != "other:open" {
		t.Fatalf("filtered by id oth, the list shows %q", v)
	}
	b.noProblems()
}

// checkRoot: GET / redirects to the console with a JSON body; the page
// carries its security headers; any other unknown path is still a JSON 404.
func checkRoot(t *testing.T, base string) {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) (*http.Response, []byte) {
		resp, err := client.Get(base + path)
		must(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		must(t, err)
		return resp, body
	}
	resp, body := get("/")
	if resp.StatusCode != 302 || resp.Header.Get("Location") != "/admin/" || resp.Header.Get("Content-Type") != "application/json" || !json.Valid(body) {
		t.Fatalf("GET / = %d, Location %q, %q %s; want a 302 to /admin/ with a JSON body", resp.StatusCode, resp.Header.Get("Location"), resp.Header.Get("Content-Type"), body)
	}
	resp, body = get("/nope")
	if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/json" || !json.Valid(body) {
		t.Fatalf("GET /nope = %d %q %s, want a JSON 404", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	resp, _ = get("/admin/")
	for k, v := range map[string]string{"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
		"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("GET /admin/: %s = %q, want %q", k, got, v)
		}
	}
}

// startSettle runs `rain settle` into a ledger file until the test ends.
func startSettle(t *testing.T, environ map[string]string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"settle", "--ledger", filepath.Join(t.TempDir(), "ledger.jsonl"), "--consumer", "console"},
			env(environ), &bytes.Buffer{}, &logtest.Buffer{})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("rain settle returned %v after cancel, want nil", err)
		}
	})
}

// getJSON is GET path with the admin token: the answer, which must be 200.
func getJSON(t *testing.T, base, path string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", base+path, nil)
	req.Header.Set("Authorization", "Bearer "+longToken)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d %v, %v", path, resp.StatusCode, m, err)
	}
	return m
}

// accountCSV is the CSV the console's download should hold for the
// account (as docs/console.md gives its columns).
func accountCSV(a map[string]any) string {
	n := func(v any) string { return fmt.Sprint(int64(v.(float64))) }
	var sb strings.Builder
	sb.WriteString("pool_id,sub_pool,preloaded_count,preloaded_cents,confirmed_count,confirmed_cents,unclaimed_count,unclaimed_cents,closed_at\r\n")
	fmt.Fprintf(&sb, "%s,all,%s,%s,%s,%s,%s,%s,%s\r\n", a["pool_id"], n(a["preloaded_count"]), n(a["preloaded_cents"]),
		n(a["confirmed_count"]), n(a["confirmed_cents"]), n(a["unclaimed_count"]), n(a["unclaimed_cents"]), a["closed_at"])
	for _, sp := range a["sub_pools"].([]any) {
		m := sp.(map[string]any)
		fmt.Fprintf(&sb, "%s,%s,,,%s,%s,%s,%s,%s\r\n", a["pool_id"], n(m["index"]), n(m["confirmed_count"]), n(m["confirmed_cents"]),
			n(m["unclaimed_count"]), n(m["unclaimed_cents"]), a["closed_at"])
	}
	return sb.String()
}
