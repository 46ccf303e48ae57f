package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/metrics"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestMetricsSeries: GET /metrics of rain serve parses with the Prometheus
// text parser and holds the series operators watch, with values that say
// what happened (one grant, 4 shards, breakers closed, the pool's stock).
func TestMetricsSeries(t *testing.T) {
	addr, _ := startServe(t, []string{"--admin-token", "m"}, nil)
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", "m", `{"pool_id":"met","total_cents":1000,"count":10}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	if code, body := post(t, base+"/grab", "", `{"pool_id":"met","user_id":"u1"}`); code != 200 {
		t.Fatalf("grab = %d %v", code, body)
	}
	fam := scrapeFamilies(t, base+"/metrics")
	sum := func(name string, match func(labels map[string]string) bool) (float64, int) {
		t.Helper()
		f, ok := fam[name]
		if !ok {
			t.Fatalf("/metrics has no %s", name)
		}
		total, n := 0.0, 0
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if match != nil && !match(labels) {
				continue
			}
			n++
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				total += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return total, n
	}
	status := func(s string) func(map[string]string) bool {
		return func(l map[string]string) bool { return l["status"] == s }
	}
	for _, c := range []struct {
		name  string
		match func(map[string]string) bool
		want  float64 // -1: any value, present
		n     int     // series wanted; 0: any
	}{
		{"rain_build_info", nil, 1, 1},
		{"rain_grabs_total", status("granted"), 1, 1},
		{"rain_grab_duration_seconds", status("granted"), 1, 1},
		{"rain_grab_overloaded_total", nil, 0, 7}, // one series per reason, internal included
		{"rain_shard_batch_duration_seconds", nil, 1, 4},
		{"rain_shard_batch_claims", nil, 1, 4},
		{"rain_shard_breaker_state", nil, 0, 4},
		{"rain_shard_batch_failures_total", nil, 0, 4},
		{"rain_shard_claims_refused_total", nil, 0, 8},
		{"rain_shard_lingers_total", nil, -1, 8},
		{"rain_shard_linger_claims_total", nil, -1, 4},
		{"rain_redis_pool_connections", nil, -1, 4},
		{"rain_redis_pool_timeouts_total", nil, 0, 4},
		{"rain_pool_capacity", nil, 32, 1},
		{"rain_pool_running", nil, -1, 1},
		{"rain_reaper_leader", nil, 1, 1},
		{"rain_reaper_lag_seconds", nil, -1, 1},
		{"rain_serial_loads_total", nil, -1, 1},
		{"rain_stock_remaining_packets", func(l map[string]string) bool { return l["pool"] == "met" }, 9, 1},
		{"rain_stock_remaining_count", func(l map[string]string) bool { return l["pool"] == "met" }, 9, 1}, // its old name, kept a release
		{"rain_http_connections", nil, -1, 1},
		{"rain_durability_relaxed", nil, 0, 1},
		{"rain_grab_cpu_short", nil, -1, 1},
		{"go_goroutines", nil, -1, 1},
		{"process_cpu_seconds_total", nil, -1, 1},
	} {
		got, n := sum(c.name, c.match)
		if (c.want >= 0 && got != c.want) || (c.n > 0 && n != c.n) {
			t.Errorf("%s: %v over %d series, want %v over %d", c.name, got, n, c.want, c.n)
		}
	}
	if v, _ := sum("rain_build_info", nil); v == 1 {
		for _, l := range fam["rain_build_info"].GetMetric()[0].GetLabel() {
			if l.GetName() == "version" && l.GetValue() == "" {
				t.Error("rain_build_info has an empty version")
			}
		}
	}

	// The latency histogram is native too: a scraper asking for protobuf
	// gets its exponential buckets beside the classic ones.
	req, _ := http.NewRequest("GET", base+"/metrics", nil)
	req.Header.Set("Accept", `application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	native := false
	for {
		var f dto.MetricFamily
		if err := dec.Decode(&f); err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
		if f.GetName() != "rain_grab_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			if h.GetSampleCount() > 0 && len(h.GetPositiveSpan()) > 0 && len(h.GetBucket()) > 0 {
				native = true
			}
		}
	}
	if !native {
		t.Error("rain_grab_duration_seconds has no native buckets beside its classic ones")
	}
}

// TestMetricsLint: every series of a live /metrics (a pool loaded and
// grabbed from, so that the stock and grab series are there) passes
// Prometheus's naming rules (promlint), but the old names kept for one
// release (metrics.Deprecated), each beside the name that replaces it.
func TestMetricsLint(t *testing.T) {
	addr, _ := startServe(t, []string{"--admin-token", "m"}, nil)
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", "m", `{"pool_id":"lint","total_cents":1000,"count":10}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	post(t, base+"/grab", "", `{"pool_id":"lint","user_id":"u1"}`)
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	problems, err := promlint.New(bytes.NewReader(b)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if _, old := metrics.Deprecated[p.Metric]; !old {
			t.Errorf("%s: %s", p.Metric, p.Text)
		}
	}
	for old, replacement := range metrics.Deprecated {
		if !bytes.Contains(b, []byte("\n"+replacement+"{")) || !bytes.Contains(b, []byte(old+" Deprecated")) {
			t.Errorf("%s is kept for a release beside %s and says it is deprecated: want both on /metrics", old, replacement)
		}
	}
}

func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fam, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse as Prometheus text: %v", err)
	}
	return fam
}

// metricValue is an unlabeled series' value on rain serve's /metrics.
func metricValue(t *testing.T, addr, name string) float64 {
	t.Helper()
	f, ok := scrapeFamilies(t, "http://"+addr+"/metrics")[name]
	if !ok || len(f.GetMetric()) == 0 {
		t.Fatalf("/metrics has no %s", name)
	}
	m := f.GetMetric()[0]
	if m.GetCounter() != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var out bytes.Buffer
		if err := run(context.Background(), []string{arg}, env(nil), &out, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(out.String(), "rain ") || !strings.Contains(out.String(), "go1.") {
			t.Errorf("rain %s printed %q, want rain's version and Go's", arg, out.String())
		}
	}
}

// TestLogsAndRequestIDs: --log-format json writes one JSON object a line,
// the first naming the version; every answer carries X-Request-Id (the
// request's own when sane, a new one when absent or not sane), and the
// access log line carries it.
func TestLogsAndRequestIDs(t *testing.T) {
	addr, logs := startServe(t, []string{"--log-format", "json", "--admin-token", "x"}, nil)
	get := func(id string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+"/livez", nil)
		if id != "" {
			req.Header.Set("X-Request-Id", id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.Header.Get("X-Request-Id")
	}
	if got := get("abc-123"); got != "abc-123" {
		t.Errorf("X-Request-Id abc-123 answered with %q, want it back", got)
	}
	a, b := get(""), get("bad id with spaces")
	if a == "" || b == "" || a == b || b == "bad id with spaces" {
		t.Errorf("new request ids %q and %q, want two distinct fresh ids", a, b)
	}
	waittest.Until(t, 5*time.Second, "the access log line of request abc-123", func() bool {
		return strings.Contains(logs.String(), `"request_id":"abc-123"`)
	})
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	first := true
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q is not JSON: %v", sc.Text(), err)
		}
		if first && (line["version"] == nil || !strings.Contains(fmt.Sprint(line["msg"]), "embedded")) {
			t.Errorf("first log line %v: want the version and the embedded warning", line)
		}
		first = false
	}
	if !strings.Contains(logs.String(), `"request_id":"abc-123"`) {
		t.Errorf("no access log line with request_id abc-123:\n%s", logs)
	}
}

// TestErrorsAreJSON: answers of no route (404, 405 with Allow) and those
// net/http writes itself (431 headers too large, 400 unparsable request)
// are JSON with a reason.
func TestErrorsAreJSON(t *testing.T) {
	addr, _ := startServe(t, nil, nil)
	check := func(what string, code int, header http.Header, body []byte, wantCode int) {
		t.Helper()
		var m map[string]string
		if code != wantCode || !strings.HasPrefix(header.Get("Content-Type"), "application/json") ||
			json.Unmarshal(body, &m) != nil || m["error"] == "" {
			t.Errorf("%s: %d %q %s, want %d with a JSON error", what, code, header.Get("Content-Type"), body, wantCode)
		}
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/nope", 404}, {"GET", "/grab", 405}, {"DELETE", "/admin/pools", 405}, {"GET", "/admin/nothing", 404},
		{"POST", "/admin/nothing", 404}, {"POST", "/admin/", 405}, {"DELETE", "/admin/pools/p/nothing", 404},
	} {
		req, _ := http.NewRequest(c.method, "http://"+addr+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		check(c.method+" "+c.path, resp.StatusCode, resp.Header, body, c.code)
		if c.code == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without Allow", c.method, c.path)
		}
	}
	raw := func(what, request string, wantCode int, readAfter time.Duration) []byte {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		go func() { _, _ = io.WriteString(conn, request) }()
		time.Sleep(readAfter) // a client slow to read what came back
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		body, _ := io.ReadAll(resp.Body)
		check(what, resp.StatusCode, resp.Header, body, wantCode)
		return body
	}
	// A grab refused before its body was read has the contract's form too:
	// a status, and pool_id and user_id (empty), always (API.md).
	var g map[string]any
	_ = json.Unmarshal(raw("a grab with headers over the limit", "POST /grab HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n", 431, 0), &g)
	if _, ok := g["pool_id"]; !ok || g["status"] != "invalid" {
		t.Errorf("a grab with headers over the limit answered %v, want status invalid with pool_id and user_id", g)
	}
	if _, ok := g["user_id"]; !ok {
		t.Errorf("a grab with headers over the limit answered %v, want user_id", g)
	}
	raw("headers over the limit", "GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 64<<10)+"\r\n\r\n", 431, 0)
	// Far over: the client is still sending when the answer goes out, and
	// reads it only after net/http's wait before closing (500 ms).
	{
		raw("headers far over the limit", "GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 8<<20)+"\r\n\r\n", 431, 700*time.Millisecond)
	}
	raw("a request line net/http cannot parse", "GET\r\n\r\n", 400, 0)
	raw("no Host header", "GET /livez HTTP/1.1\r\n\r\n", 400, 0)
	// What net/http's own code answers, and the adaptor to it: JSON too.
	raw("a malformed escape in the path", "GET /%zz HTTP/1.1\r\nHost: x\r\n\r\n", 400, 0)
	raw("a malformed escape in an operator's path", "POST /admin/pools/%zz/end HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 400, 0)
	raw("CONNECT", "CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\n\r\n", 405, 0)
	raw("OPTIONS *", "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 400, 0)
	for _, c := range []struct{ what, request, location string }{
		{"a path that is not clean", "GET //healthz HTTP/1.1\r\nHost: x\r\n\r\n", "/healthz"},
		{"an operator's path that is not clean", "POST /admin/pools/p1/../p1/end HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", "/admin/pools/p1/end"},
		{"the dashboard without its slash", "GET /admin HTTP/1.1\r\nHost: x\r\n\r\n", "/admin/"},
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(conn, c.request)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		var m map[string]string
		derr := json.NewDecoder(resp.Body).Decode(&m)
		conn.Close()
		if resp.StatusCode/100 != 3 || resp.Header.Get("Location") != c.location || resp.Header.Get("Content-Type") != "application/json" ||
			derr != nil || m["location"] != c.location {
			t.Errorf("%s: %d Location %q %s %v (%v), want a redirect to %s in JSON", c.what, resp.StatusCode, resp.Header.Get("Location"),
				resp.Header.Get("Content-Type"), m, derr, c.location)
		}
	}
}

// TestDrainOnStop: on SIGTERM (the context's end) /readyz answers 503
// {"draining":true} at once, while requests are still served, and the
// listener closes after --drain-delay.
func TestDrainOnStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &logtest.Buffer{}
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "5s"}, env(nil), &bytes.Buffer{}, logs)
	}()
	base := "http://" + serving(t, logs, done)
	t.Cleanup(cancel)
	waittest.Until(t, 10*time.Second, "rain serve ready", func() bool {
		r, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
	stopped := time.Now()
	cancel()
	// Well within the drain delay: a busy machine's slow polls still see it.
	waittest.Until(t, 3*time.Second, "/readyz 503 draining after SIGTERM", func() bool {
		var ready map[string]any
		r, err := http.Get(base + "/readyz")
		if err != nil {
			t.Fatalf("readyz during the drain: %v", err)
		}
		_ = json.NewDecoder(r.Body).Decode(&ready)
		r.Body.Close()
		return r.StatusCode == 503 && ready["draining"] == true
	})
	if r, err := http.Get(base + "/livez"); err != nil || r.StatusCode != 200 {
		t.Fatalf("livez during the drain = %v, %v; want served", r, err)
	} else {
		r.Body.Close()
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(stopped); took < 5*time.Second {
		t.Fatalf("serve stopped %v after SIGTERM, want after the 5s drain delay", took)
	}
}

// TestPreloadProgress: a big preload shows its progress; not on a terminal,
// as a line every tenth, from 0% to 100%, with the counts.
func TestPreloadProgress(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	environ := map[string]string{"RAIN_REDIS": shardtest.Flag(redistest.Addrs(servers))}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"preload", "--pool", "big", "--total-cents", "400000", "--count", "200000"},
		env(environ), &out, &errOut); err != nil {
		t.Fatalf("rain preload: %v (%s)", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[len(lines)-1], "preload big: 100% (200000 of 200000 packets)") {
		t.Fatalf("progress lines %q, want lines ending at 100%% (200000 of 200000 packets)", lines)
	}
	last := -1
	for _, l := range lines {
		var pct int
		if _, err := fmt.Sscanf(l, "preload big: %d%%", &pct); err != nil || pct <= last {
			t.Fatalf("progress line %q after %d%%: want a rising percentage", l, last)
		}
		last = pct
	}

	// A small pool shows none.
	errOut.Reset()
	if err := run(context.Background(), []string{"preload", "--pool", "small", "--total-cents", "100", "--count", "10"},
		env(environ), &out, &errOut); err != nil || errOut.Len() != 0 {
		t.Fatalf("small preload: %v, printed %q; want nothing on stderr", err, errOut.String())
	}
}

// TestMetricsListenApart: with --metrics-listen, /metrics is served on that
// address and not on the API's (404 there, as JSON), so stock and load
// figures stay off the clients' network.
func TestMetricsListenApart(t *testing.T) {
	addr, logs := startServe(t, []string{"--admin-token", "m", "--metrics-listen", "127.0.0.1:0"}, nil)
	metricsAddr := apartAddr(t, logs, "metrics-listen")
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /metrics on the API listener = %d %s, want a JSON 404", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if v := metricValue(t, metricsAddr, "rain_durability_relaxed"); v != 0 {
		t.Fatalf("rain_durability_relaxed on the metrics listener = %v, want 0", v)
	}
	if _, ok := scrapeFamilies(t, "http://"+metricsAddr+"/metrics")["rain_build_info"]; !ok {
		t.Fatal("the metrics listener has no rain_build_info")
	}
}

// TestMetricsWithAFrozenShard: a scrape of /metrics answers while a shard
// that holds a live sub-pool is frozen (SIGSTOP), although a call to that
// shard may take --shard-timeout (a minute here, three times the client's
// patience): the frozen shard's stock is left out of the scrape instead,
// so the scrape never waited for it.
func TestMetricsWithAFrozenShard(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	environ := map[string]string{"RAIN_REDIS": shardtest.Flag(redistest.Addrs(servers)), "RAIN_ADMIN_TOKEN": longToken}
	addr, _ := startServe(t, []string{"--shard-timeout", "60s"}, environ)
	client := &http.Client{Timeout: 20 * time.Second}
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", longToken, `{"pool_id":"frz","total_cents":1000,"count":10,"sub_pools":2}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	if code, body := post(t, base+"/grab", "", `{"pool_id":"frz","user_id":"u1"}`); code != 200 {
		t.Fatalf("grab = %d %v", code, body)
	}
	scrape := func() string {
		t.Helper()
		r, err := client.Get(base + "/metrics")
		if err != nil {
			t.Fatalf("a scrape with a frozen shard: %v (it waited for the shard, not the stock's budget %v)", err, metrics.StockBudget)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != 200 {
			t.Fatalf("/metrics = %d", r.StatusCode)
		}
		return string(b)
	}
	if body := scrape(); strings.Count(body, `rain_stock_remaining_cents{pool="frz"`) != 2 {
		t.Fatalf("/metrics before the freeze lacks the stock of both sub-pools")
	}
	servers[1].Pause()
	defer servers[1].Resume()
	// Past the stock's cache (metrics.StockEvery) a scrape reads the shards
	// again while one is frozen, and answers without its stock.
	waittest.Until(t, 20*time.Second, "a scrape without the frozen shard's stock", func() bool {
		return strings.Count(scrape(), `rain_stock_remaining_cents{pool="frz"`) == 1
	})
}
