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
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"rain/internal/auth"
	"rain/loadtest/rainload/internal/timeline"
)

// fasthttp keeps two goroutines of its own for the life of the process
// (the Date header's clock, and a worker pool's cleaner that sleeps 10 s
// between looks at its stop channel): rainload fixed -server fasthttp
// leaves them behind its stopped server.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

// answers is what fakeRain answers a user whose number ends in i: every status of
// docs/api.md with its code, a 500, and a dropped connection.
var answers = [10]struct {
	code   int
	status string // "" for no answer at all
}{
	{200, "granted"}, {200, "already_granted"}, {410, "sold_out"}, {404, "not_found"},
	{425, "not_started"}, {410, "ended"}, {503, "overloaded"}, {400, "invalid"},
	{500, "oops"}, {0, ""},
}

// fakeRain is a stand-in for rain: POST /grab answers by the last digit of the
// user id (see answers), granted ones in chunked encoding; the operator endpoints
// need the token "T" and serve a pool "p" with stock that the grants use up.
type fakeRain struct {
	users     *auth.Users   // when set, a grab needs a user token for its user_id
	delay     time.Duration // before each grab answer
	preloads  atomic.Int64
	remaining atomic.Int64
}

func (f *fakeRain) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" && r.Header.Get("Authorization") != "" {
		w.WriteHeader(http.StatusBadRequest) // rain's /metrics takes no token: none must be sent there
		return
	}
	if strings.HasPrefix(r.URL.Path, "/admin/") {
		if r.Header.Get("Authorization") != "Bearer T" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
	}
	switch {
	case r.Method == "POST" && r.URL.Path == "/admin/pools":
		var req struct {
			PoolID     string `json:"pool_id"`
			Count      int64  `json:"count"`
			TotalCents int64  `json:"total_cents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.PoolID != "p" || req.Count != 1000 || req.TotalCents != 5000 {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		f.preloads.Add(1)
		f.remaining.Store(req.Count)
		w.WriteHeader(http.StatusCreated)
	case r.Method == "GET" && r.URL.Path == "/admin/pools/p":
		fmt.Fprintf(w, `{"pool_id":"p","remaining_count":%d,"remaining_cents":%d}`, f.remaining.Load(), 5*f.remaining.Load())
	case r.Method == "GET" && r.URL.Path == "/metrics":
		io.WriteString(w, "# TYPE rain_pool_capacity gauge\nrain_pool_capacity 64\nrain_pool_running{x=\"a b\"} 3\nrain_pool_running{x=\"c\"} 4\nrain_grabs_total{status=\"granted\"} 9\n")
	case r.Method == "POST" && r.URL.Path == "/grab":
		var req struct {
			UserID string `json:"user_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.UserID == "" {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		if f.users != nil {
			if sub, err := f.users.Subject(r.Header.Get("Authorization")); err != nil || sub != req.UserID {
				w.WriteHeader(http.StatusUnauthorized)
				fmt.Fprintf(w, `{"status":"unauthorized","error":%q}`, fmt.Sprint(err))
				return
			}
		}
		time.Sleep(f.delay)
		a := answers[req.UserID[len(req.UserID)-1]-'0']
		if a.code == 0 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.code)
		if a.status == "granted" {
			f.remaining.Add(-1)
			io.WriteString(w, `{"status":"granted",`)
			w.(http.Flusher).Flush() // chunked from here on
			fmt.Fprintf(w, `"pool_id":"p","user_id":%q,"amount_cents":5,"serial":1}`, req.UserID)
			return
		}
		fmt.Fprintf(w, `{"status":%q,"pool_id":"p","user_id":%q}`, a.status, req.UserID)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

// start serves f on 127.0.0.1 for the test.
func (f *fakeRain) start(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

// runOK runs rainload with args and returns what it printed on stdout.
func runOK(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr:\n%s", args, err, stderr.String())
	}
	return stdout.String()
}

func readSummary(t *testing.T, path string) (*Summary, map[string]any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s Summary
	var raw map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("summary does not parse: %v\n%s", err, b)
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	return &s, raw
}

func readTimeline(t *testing.T, path string) []timeline.Sample {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ss, err := timeline.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

func TestRunCountsEveryStatus(t *testing.T) {
	f := &fakeRain{}
	url := f.start(t)
	dir := t.TempDir()
	sumPath, tlPath := filepath.Join(dir, "s.json"), filepath.Join(dir, "t.jsonl")
	// 500 new users u0..u499, 50 of each last digit: 50 of each answer.
	out := runOK(t, context.Background(), "-url", url, "-pool", "p", "-rate", "500", "-duration", "1s",
		"-repeat", "0", "-conns", "8", "-progress", "0", "-summary", sumPath, "-timeline", tlPath,
		"-admin-token", "T", "-preload", "1000:5000", "-scrape")
	s, raw := readSummary(t, sumPath)

	for _, key := range []string{
		"target", "pool", "started_at", "ended_at", "schedule_s", "elapsed_s", "stopped_early",
		"start_rate", "stages", "users", "user_prefix", "repeat", "max_inflight", "conns", "timeout_s",
		"scheduled", "sent", "answered", "dropped", "offered_rps", "achieved_rps", "goodput_rps",
		"shed_rps", "statuses", "http_codes", "latency_ms", "lag_ms", "scrape_errors",
	} {
		if _, ok := raw[key]; !ok {
			t.Errorf("summary has no field %q", key)
		}
	}
	lat := raw["latency_ms"].(map[string]any)
	for _, key := range []string{"overall", "accepted", "by_status"} {
		if _, ok := lat[key]; !ok {
			t.Errorf("summary latency_ms has no field %q", key)
		}
	}
	for _, key := range []string{"count", "mean", "p50", "p90", "p99", "p999", "max"} {
		if _, ok := lat["accepted"].(map[string]any)[key]; !ok {
			t.Errorf("summary latency_ms.accepted has no field %q", key)
		}
	}

	if s.Scheduled != 500 || s.Sent != 500 || s.Dropped != 0 || s.Answered != 450 {
		t.Errorf("scheduled %d sent %d dropped %d answered %d, want 500 500 0 450", s.Scheduled, s.Sent, s.Dropped, s.Answered)
	}
	for _, name := range statusNames {
		want := int64(50)
		if name == "unauthorized" || name == "rate_limited" {
			want = 0 // fakeRain checks no token nor rate (TestUserSecret does)
		}
		if got, ok := s.Statuses[name]; got != want || !ok {
			t.Errorf("statuses[%s] = %d (present: %v), want %d", name, got, ok, want)
		}
	}
	wantCodes := map[string]int64{"200": 100, "410": 100, "404": 50, "425": 50, "503": 50, "400": 50, "500": 50}
	for code, want := range wantCodes {
		if got := s.HTTPCodes[code]; got != want {
			t.Errorf("http_codes[%s] = %d, want %d", code, got, want)
		}
	}
	if len(s.HTTPCodes) != len(wantCodes) {
		t.Errorf("http_codes = %v, want only %v", s.HTTPCodes, wantCodes)
	}
	// 300 goodput answers (six statuses), 50 shed, over 1 s of schedule.
	if s.ScheduleS != 1 || s.OfferedRPS != 500 || s.GoodputRPS != 300 || s.ShedRPS != 50 || s.AchievedRPS != 450 {
		t.Errorf("schedule_s %v offered %v goodput %v shed %v achieved %v, want 1 500 300 50 450",
			s.ScheduleS, s.OfferedRPS, s.GoodputRPS, s.ShedRPS, s.AchievedRPS)
	}
	if s.Latency.Overall.Count != 500 || s.Latency.Accepted.Count != 400 || s.Latency.ByStatus["granted"].Count != 50 {
		t.Errorf("latency counts overall %d accepted %d granted %d, want 500 400 50",
			s.Latency.Overall.Count, s.Latency.Accepted.Count, s.Latency.ByStatus["granted"].Count)
	}
	if p := s.Latency.Accepted; !(p.P50 > 0 && p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.P999 && p.P999 <= p.Max) {
		t.Errorf("accepted percentiles not ordered: %+v", p)
	}
	if f.preloads.Load() != 1 {
		t.Errorf("preloads = %d, want 1", f.preloads.Load())
	}
	if !strings.Contains(out, "goodput 300.0/s") {
		t.Errorf("printed summary lacks the goodput:\n%s", out)
	}

	ss := readTimeline(t, tlPath)
	var offered, answered, goodput, shed int64
	for _, smp := range ss {
		offered += smp.Offered
		answered += smp.Answered
		goodput += smp.Goodput
		shed += smp.Shed
	}
	if offered != 500 || answered != 450 || goodput != 300 || shed != 50 {
		t.Errorf("timeline sums: offered %d answered %d goodput %d shed %d, want 500 450 300 50", offered, answered, goodput, shed)
	}
	last := ss[len(ss)-1]
	if last.Gauges["rain_pool_capacity"] != 64 || last.Gauges["rain_pool_running"] != 7 || len(last.Gauges) != 2 {
		t.Errorf("last sample's gauges = %v, want capacity 64 and running 7 (summed over labels)", last.Gauges)
	}
	// The final scrape runs after the last answer: 50 of 1000 packets granted.
	if last.RemainingCount == nil || *last.RemainingCount != 950 || *last.RemainingCents != 4750 {
		t.Errorf("last sample's remaining = %v/%v, want 950/4750", last.RemainingCount, last.RemainingCents)
	}
}

// A slow server and a small -max-inflight: arrivals beyond it are dropped and
// counted, and none waits for a slot (latency stays near the service time).
func TestDropsAreCountedNotQueued(t *testing.T) {
	f := &fakeRain{delay: 200 * time.Millisecond}
	url := f.start(t)
	sumPath := filepath.Join(t.TempDir(), "s.json")
	runOK(t, context.Background(), "-url", url, "-pool", "p", "-rate", "200", "-duration", "500ms",
		"-max-inflight", "5", "-progress", "0", "-summary", sumPath, "-user-prefix", "x")
	s, _ := readSummary(t, sumPath)
	// 100 arrivals; 5 at a time for 200 ms each fit about 15 in 0.5 s.
	if s.Scheduled != 100 || s.Sent+s.Dropped != 100 {
		t.Errorf("scheduled %d, sent %d + dropped %d, want 100 = sent + dropped", s.Scheduled, s.Sent, s.Dropped)
	}
	if s.Dropped < 70 || s.Sent > 20 || s.Sent < 5 {
		t.Errorf("sent %d dropped %d, want about 15 sent and 85 dropped", s.Sent, s.Dropped)
	}
	// Not overall: a user ending in 9 has its connection closed, and its
	// request is sent again on a new one (twice the service time).
	if m := s.Latency.Accepted.Max; m > 350 {
		t.Errorf("max accepted latency %.0f ms: a request waited for a slot (service time 200 ms)", m)
	}
	if s.Latency.Overall.P50 < 200 {
		t.Errorf("p50 latency %.1f ms, below the server's 200 ms delay", s.Latency.Overall.P50)
	}
}

func TestStopEarlyStillWritesSummary(t *testing.T) {
	f := &fakeRain{}
	url := f.start(t)
	sumPath := filepath.Join(t.TempDir(), "s.json")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	runOK(t, ctx, "-url", url, "-pool", "p", "-stages", "10s:100,10s:100", "-start-rate", "100",
		"-progress", "0", "-summary", sumPath)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("run took %v after a cancel at 300 ms", d)
	}
	s, _ := readSummary(t, sumPath)
	if !s.StoppedEarly || s.ScheduleS > 1 || s.Scheduled < 20 || s.Scheduled > 50 {
		t.Errorf("stopped_early %v schedule_s %v scheduled %d, want true, about 0.3 s, about 30",
			s.StoppedEarly, s.ScheduleS, s.Scheduled)
	}
	if len(s.Stages) != 2 || s.Stages[1].DurationS != 10 || s.Stages[1].Target != 100 {
		t.Errorf("stages = %+v, want the two of -stages", s.Stages)
	}
}

// A schedule that ends in a stage without arrivals still lasts to its end.
func TestTrailingIdleStage(t *testing.T) {
	f := &fakeRain{}
	url := f.start(t)
	sumPath := filepath.Join(t.TempDir(), "s.json")
	runOK(t, context.Background(), "-url", url, "-pool", "p", "-stages", "100ms:100,300ms:0,200ms:0",
		"-progress", "0", "-summary", sumPath)
	s, _ := readSummary(t, sumPath)
	if s.ScheduleS != 0.6 || s.ElapsedS < 0.6 || s.StoppedEarly {
		t.Errorf("schedule_s %v elapsed_s %v stopped_early %v, want 0.6, >= 0.6, false", s.ScheduleS, s.ElapsedS, s.StoppedEarly)
	}
	// 5 arrivals in the ramp up to 100/s over 100 ms, 15 in the ramp down over
	// 300 ms, none in the last 200 ms.
	if s.Scheduled < 19 || s.Scheduled > 21 {
		t.Errorf("scheduled %d, want 20 ±1", s.Scheduled)
	}
}

// A server that never answers: requests end as transport errors after -timeout,
// and the run ends -timeout after its schedule.
func TestTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { io.Copy(io.Discard, c); c.Close() }) // reads, never answers
		}
	})
	sumPath := filepath.Join(t.TempDir(), "s.json")
	start := time.Now()
	runOK(t, context.Background(), "-url", "http://"+ln.Addr().String(), "-pool", "p", "-rate", "20",
		"-duration", "200ms", "-timeout", "300ms", "-progress", "0", "-summary", sumPath)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("run took %v, want about 0.5 s", d)
	}
	s, _ := readSummary(t, sumPath)
	if s.Statuses["transport"] != 4 || s.Answered != 0 {
		t.Errorf("transport %d answered %d, want 4 and 0", s.Statuses["transport"], s.Answered)
	}
}

// A server that closes each connection after one answer without saying so (as
// an idle timeout does): each next request on the connection is sent again on a
// new one, and nothing fails.
func TestClosedKeepAliveIsRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				body := `{"status":"granted"}`
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			})
		}
	})
	sumPath := filepath.Join(t.TempDir(), "s.json")
	runOK(t, context.Background(), "-url", "http://"+ln.Addr().String(), "-pool", "p", "-rate", "50",
		"-duration", "200ms", "-conns", "1", "-progress", "0", "-summary", sumPath)
	s, _ := readSummary(t, sumPath)
	if s.Statuses["granted"] != 10 || s.Statuses["transport"] != 0 {
		t.Errorf("granted %d transport %d, want 10 and 0", s.Statuses["granted"], s.Statuses["transport"])
	}
	if n := accepted.Load(); n != 10 {
		t.Errorf("%d connections, want 10 (one per request)", n)
	}
}

// TestFixedServers: each server of rainload fixed -server answers the same
// bytes to the same requests (the floors of scripts/bench.sh budget differ
// only in their HTTP layer), as well-formed HTTP that net/http reads, and
// carries a load run.
func TestFixedServers(t *testing.T) {
	for _, name := range []string{"bare", "net/http", "fasthttp"} {
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- fixedServers[name](newFixed(), ctx, ln) }()
			url := "http://" + ln.Addr().String()

			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			c := &http.Client{Transport: tr}
			for _, tt := range []struct {
				body string
				code int
				want string // the whole answer; "" for any with status invalid
			}{
				{`{"pool_id":"p","user_id":"u1"}`, 200,
					`{"status":"granted","pool_id":"p","user_id":"u1","amount_cents":1,"serial":1,"expires_at":"2030-01-01T00:00:00Z"}`},
				{`{"pool_id":"p","user_id":"u2"}`, 200,
					`{"status":"granted","pool_id":"p","user_id":"u2","amount_cents":1,"serial":2,"expires_at":"2030-01-01T00:00:00Z"}`},
				{`{"pool_id":"p","user_id":"u 1"}`, 400, ""},
				{`{"pool_id":"p","user_id":"u1","x":1}`, 400, ""},
				{`{`, 400, ""},
			} {
				resp, err := c.Post(url+"/grab", "application/json", strings.NewReader(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var got struct {
					Status string `json:"status"`
				}
				ok := resp.StatusCode == tt.code && resp.Header.Get("Content-Type") == "application/json"
				if tt.want != "" {
					ok = ok && string(b) == tt.want
				} else {
					ok = ok && json.Unmarshal(b, &got) == nil && got.Status == "invalid"
				}
				if !ok {
					t.Errorf("POST /grab %s = %d %s %s, want %d %s", tt.body, resp.StatusCode,
						resp.Header.Get("Content-Type"), b, tt.code, tt.want)
				}
			}
			resp, err := c.Post(url+"/grab", "application/json", strings.NewReader(strings.Repeat(" ", maxRequest+1)))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("POST /grab of %d bytes = %d, want 413", maxRequest+1, resp.StatusCode)
			}
			for path, code := range map[string]int{"/healthz": 200, "/nope": 404} {
				resp, err := c.Get(url + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != code {
					t.Errorf("GET %s = %d, want %d", path, resp.StatusCode, code)
				}
			}
			tr.CloseIdleConnections()

			sumPath := filepath.Join(t.TempDir(), "s.json")
			runOK(t, context.Background(), "-url", url, "-pool", "p", "-rate", "400", "-duration", "500ms",
				"-progress", "0", "-summary", sumPath)
			s, _ := readSummary(t, sumPath)
			if s.Statuses["granted"] != 200 || s.GoodputRPS != 400 {
				t.Errorf("granted %d goodput %v/s, want 200 and 400/s", s.Statuses["granted"], s.GoodputRPS)
			}

			cancel()
			if err := <-errc; err != nil {
				t.Errorf("serve after cancel = %v, want nil", err)
			}
		})
	}
}

func TestReportCommand(t *testing.T) {
	dir := t.TempDir()
	tl := filepath.Join(dir, "spike.jsonl")
	var b strings.Builder
	for i := range 5 {
		rem := int64(1000 - 100*i)
		s := timeline.Sample{T: i, Offered: int64(100 * i), Answered: int64(90 * i), Goodput: int64(90 * i),
			P50Ms: 1, P99Ms: 5, P999Ms: 9, Statuses: map[string]int64{"granted": int64(90 * i)},
			Gauges: map[string]float64{"rain_pool_capacity": 8}, RemainingCount: &rem}
		j, _ := json.Marshal(s)
		b.Write(append(j, '\n'))
	}
	if err := os.WriteFile(tl, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "r.html")
	runOK(t, context.Background(), "report", "-o", out, "-title", "t<1>", "rain spike="+tl, tl)
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"rain spike", ">spike<", "t&lt;1&gt;", "<svg"} {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("report lacks %q", want)
		}
	}
	if n := bytes.Count(page, []byte("<svg")); n != 10 {
		t.Errorf("report has %d charts, want 10 (5 per run)", n)
	}
}

func TestParseLoad(t *testing.T) {
	c, err := parseLoad([]string{"-pool", "p", "-rate", "100", "-duration", "2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "127.0.0.1:8080" || c.users != 10_000_000 || c.userPrefix != "u" || c.repeat != 0.2 ||
		c.maxInflight != 10_000 || c.conns != 256 || c.timeout != 5*time.Second || c.progress != time.Second ||
		c.startRate != 100 || len(c.stages) != 1 || c.stages[0].Duration != 2*time.Second {
		t.Errorf("defaults: %+v", c)
	}
	c, err = parseLoad([]string{"-pool", "p", "-stages", "1s:10,2s:0", "-max-inflight", "4", "-url", "http://localhost/x"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.conns != 4 || c.addr != "localhost:80" || len(c.stages) != 2 {
		t.Errorf("conns %d addr %s stages %v, want conns capped at -max-inflight 4, localhost:80, 2 stages", c.conns, c.addr, c.stages)
	}

	bad := []struct {
		args []string
		want string // in the error
	}{
		{[]string{"-rate", "1", "-duration", "1s"}, "-pool"},
		{[]string{"-pool", "a b", "-rate", "1", "-duration", "1s"}, "-pool"},
		{[]string{"-pool", "p"}, "-rate"},
		{[]string{"-pool", "p", "-rate", "1"}, "-rate"},
		{[]string{"-pool", "p", "-rate", "0", "-duration", "1s"}, "-rate"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-stages", "1s:1"}, "not both"},
		{[]string{"-pool", "p", "-start-rate", "5", "-rate", "1", "-duration", "1s"}, "-start-rate"},
		{[]string{"-pool", "p", "-stages", "1s"}, "-stages"},
		{[]string{"-pool", "p", "-stages", "0s:5"}, "-stages"},
		{[]string{"-pool", "p", "-stages", "1s:-5"}, "-stages"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-url", "https://x"}, "-url"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-url", "127.0.0.1:80"}, "-url"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-users", "0"}, "-users"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-user-prefix", "u/"}, "-user-prefix"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-user-prefix", strings.Repeat("u", 60)}, "-user-prefix"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-repeat", "1.5"}, "-repeat"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-max-inflight", "0"}, "-max-inflight"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-conns", "0"}, "-conns"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-timeout", "0s"}, "-timeout"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-progress", "-1s"}, "-progress"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-preload", "10"}, "-preload"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-preload", "0:10", "-admin-token", "T"}, "-preload"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-preload", "10:100"}, "-admin-token"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "-scrape"}, "-admin-token"},
		{[]string{"-pool", "p", "-rate", "1", "-duration", "1s", "extra"}, "unexpected"},
		{[]string{"-pool", "p", "-rate", "x"}, "-rate"},
		{[]string{"-nope"}, "nope"},
	}
	for _, tt := range bad {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := parseLoad(tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseLoad(%q) = %v, want an error about %s", tt.args, err, tt.want)
			}
		})
	}
}

func TestRunCommands(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run(context.Background(), []string{"nope"}, &out, &errb); err == nil {
		t.Error("run(nope) = nil, want an unknown command error")
	}
	if err := run(context.Background(), []string{"-h"}, &out, &errb); err != nil {
		t.Errorf("run(-h) = %v, want nil (help)", err)
	}
	if !strings.Contains(errb.String(), "-max-inflight") {
		t.Errorf("-h printed no flags:\n%s", errb.String())
	}
	if err := run(context.Background(), []string{"report", "-o", filepath.Join(t.TempDir(), "x.html")}, &out, &errb); err == nil {
		t.Error("report with no timelines = nil, want an error")
	}
	if err := run(context.Background(), []string{"fixed", "-listen", "127.0.0.1:-1"}, &out, &errb); err == nil {
		t.Error("fixed on a bad address = nil, want an error")
	}
	if err := run(context.Background(), []string{"fixed", "-server", "nginx"}, &out, &errb); err == nil {
		t.Error("fixed -server nginx = nil, want an error")
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		code int
		body string
		want status
	}{
		{200, `{"status":"granted","pool_id":"p"}`, granted},
		{200, `{"pool_id":"p", "status" : "already_granted"}`, alreadyGranted},
		{410, `{"status":"sold_out"}`, soldOut},
		{410, `{"status":"ended"}`, ended},
		{404, `{"status":"not_found"}`, notFound},
		{425, `{"status":"not_started"}`, notStarted},
		{400, `{"status":"invalid","error":"json: unknown field \"status\""}`, invalid},
		{503, `{"status":"overloaded"}`, overloaded},
		{503, ``, overloaded},
		{500, `{"status":"granted"}`, errStatus},
		{502, `bad gateway`, errStatus},
		{200, `{"status":"maybe"}`, errStatus},
		{200, `{"status":1}`, errStatus},
		{401, `{"error":"no token"}`, errStatus},
		{401, `{"status":"unauthorized","error":"missing bearer token"}`, unauthorized},
		{429, `{"status":"rate_limited","error":"this client is over its rate of grabs"}`, rateLimited},
		{200, `{"status":"granted`, errStatus},
	}
	for _, tt := range tests {
		if got := classify(tt.code, []byte(tt.body)); got != tt.want {
			t.Errorf("classify(%d, %s) = %s, want %s", tt.code, tt.body, statusNames[got], statusNames[tt.want])
		}
	}
}

func TestAppendRequest(t *testing.T) {
	cfg, err := parseLoad([]string{"-pool", "cny2027", "-rate", "1", "-duration", "1s", "-url", "http://h:1/api/"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := newConn(&driver{cfg: cfg})
	for _, user := range []int64{0, 9, 10, 1234567} {
		req := string(c.appendRequest(nil, user))
		head, body, _ := strings.Cut(req, "\r\n\r\n")
		want := `{"pool_id":"cny2027","user_id":"u` + strconv.FormatInt(user, 10) + `"}`
		if body != want {
			t.Errorf("body = %s, want %s", body, want)
		}
		if !strings.HasPrefix(head, "POST /api/grab HTTP/1.1\r\nHost: h:1\r\n") ||
			!strings.HasSuffix(head, "Content-Length: "+strconv.Itoa(len(want))) {
			t.Errorf("head = %q", head)
		}
	}
}

// TestUserSecret: with -user-secret (and -user-audience, -user-issuer),
// every grab carries a token rain's own verifier (internal/auth, as rain
// serve --user-auth hs256:FILE runs it) takes, for the grab's user; with
// no secret or another one, every grab is answered unauthorized and
// counted so.
func TestUserSecret(t *testing.T) {
	dir := t.TempDir()
	secret, other := filepath.Join(dir, "secret"), filepath.Join(dir, "other")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte(strings.Repeat("o", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	users, err := auth.NewUsers(auth.UserConfig{Spec: "hs256:" + secret, Audience: "rain", Issuer: "login"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeRain{users: users}
	url := f.start(t)
	load := func(extra ...string) *Summary {
		t.Helper()
		sum := filepath.Join(t.TempDir(), "s.json")
		args := append([]string{"-url", url, "-pool", "p", "-rate", "200", "-duration", "500ms",
			"-repeat", "0.2", "-conns", "4", "-progress", "0", "-summary", sum}, extra...)
		runOK(t, context.Background(), args...)
		s, _ := readSummary(t, sum)
		return s
	}
	s := load("-user-secret", secret, "-user-audience", "rain", "-user-issuer", "login")
	if s.Statuses["unauthorized"] != 0 || s.Statuses["granted"] == 0 {
		t.Fatalf("with the secret: %v, want grants and no unauthorized", s.Statuses)
	}
	for _, extra := range [][]string{nil, {"-user-secret", other, "-user-audience", "rain", "-user-issuer", "login"}, {"-user-secret", secret}} {
		if s := load(extra...); s.Statuses["unauthorized"] != s.Answered || s.Answered == 0 {
			t.Errorf("%q: %v of %d answered, want all unauthorized", extra, s.Statuses, s.Answered)
		}
	}
	var stderr bytes.Buffer
	short := filepath.Join(dir, "short")
	_ = os.WriteFile(short, []byte("short"), 0o600)
	if err := run(context.Background(), []string{"-url", url, "-pool", "p", "-rate", "1", "-duration", "1s", "-user-secret", short}, io.Discard, &stderr); err == nil || !strings.Contains(err.Error(), "32 or more") {
		t.Errorf("a 5-byte secret: %v, want refused", err)
	}
}

// BenchmarkAppendRequestSigned: what a user token adds to each request the
// driver writes.
func BenchmarkAppendRequestSigned(b *testing.B) {
	secret := filepath.Join(b.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("s", 40)), 0o600); err != nil {
		b.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"-user-secret", secret}} {
		cfg, err := parseLoad(append([]string{"-pool", "p", "-rate", "1", "-duration", "1s"}, extra...), io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		c := newConn(&driver{cfg: cfg})
		b.Run(fmt.Sprintf("signed=%v", extra != nil), func(b *testing.B) {
			buf := make([]byte, 0, 1024)
			var i int64
			for b.Loop() {
				i++
				buf = c.appendRequest(buf[:0], i)
			}
		})
	}
}

// TestScrapeMetricsURL: with -metrics-url, -scrape reads the gauges there
// (a rain serve --metrics-listen serves /metrics apart from the API).
func TestScrapeMetricsURL(t *testing.T) {
	f := &fakeRain{}
	url := f.start(t)
	ops := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" || r.Header.Get("Authorization") != "" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		io.WriteString(w, "rain_pool_capacity 77\n")
	}))
	t.Cleanup(ops.Close)
	tl := filepath.Join(t.TempDir(), "t.jsonl")
	runOK(t, context.Background(), "-url", url, "-pool", "p", "-rate", "50", "-duration", "1500ms",
		"-progress", "0", "-timeline", tl, "-admin-token", "T", "-scrape", "-metrics-url", ops.URL+"/metrics")
	ss := readTimeline(t, tl)
	if last := ss[len(ss)-1]; last.Gauges["rain_pool_capacity"] != 77 {
		t.Fatalf("last sample's gauges = %v, want capacity 77 from -metrics-url", last.Gauges)
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-url", url, "-pool", "p", "-rate", "1", "-duration", "1s", "-metrics-url", ops.URL + "/metrics"}, io.Discard, &stderr); err == nil {
		t.Error("-metrics-url without -scrape was taken")
	}
}
