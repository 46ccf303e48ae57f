package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain/internal/logtest"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// IgnoreCurrent: ants starts a default pool of its own at init.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(cleanup{m}, goleak.IgnoreCurrent(), redistest.IgnoreProbe(),
		// fasthttp's clock of the Date header runs for the process; a
		// server's idle-worker sweeper ends within 10 s of its shutdown.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"))
}

// cleanup removes what the tests left for the whole run (the rain binary
// rainBinary built) once they are done.
type cleanup struct{ *testing.M }

func (c cleanup) Run() int {
	code := c.M.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// longToken is an admin token strong enough for rain serve --redis (the
// hex of 16 random bytes).
const longToken = "5d0c8e2fa7194b63e0d8c1f2a9b7463e"

// startServe runs `rain serve --listen 127.0.0.1:0` in the background
// until the test ends, and returns the address it logs that it serves on.
// User auth is off (RAIN_USER_AUTH=none, so that nothing warns of it being
// unset) unless the test's environment or flags say otherwise.
func startServe(t *testing.T, args []string, environ map[string]string) (addr string, logs *logtest.Buffer) {
	t.Helper()
	logs = &logtest.Buffer{}
	withNone := map[string]string{"RAIN_USER_AUTH": userAuthNone}
	for k, v := range environ {
		withNone[k] = v
	}
	environ = withNone
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		// No drain delay unless a test asks for one: the tests stop at once.
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0"}, args...), env(environ), &bytes.Buffer{}, logs)
	}()
	t.Cleanup(func() {
		cancel() // as SIGTERM does
		if err := <-done; err != nil {
			t.Errorf("serve returned %v after shutdown, want nil", err)
		}
	})
	return serving(t, logs, done), logs
}

// servingRE is rain's log line of the address it serves on, as text or
// as JSON (--log-format json).
var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)|"msg":"serving","addr":"([^"]+)"`)

// serving waits until the logs say where rain serves and returns that
// address; done, when rain returns early, fails the test (the error is
// put back for the caller's cleanup).
func serving(t *testing.T, logs *logtest.Buffer, done chan error) (addr string) {
	t.Helper()
	waittest.Until(t, 20*time.Second, "rain logging the address it serves on", func() bool {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("rain returned %v before serving; logs:\n%s", err, logs)
		default:
		}
		if m := servingRE.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1] + m[2]
		}
		return addr != ""
	})
	return addr
}

func post(t *testing.T, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func TestServeEmbedded(t *testing.T) {
	// The old name of --workers (--pool) is warned of after the first line.
	for _, args := range [][]string{nil, {"--workers", "off"}, {"--pool", "off"}} {
		t.Run(fmt.Sprint(args), func(t *testing.T) { testServeEmbedded(t, args) })
	}
}

// TestServeEmbeddedQuiet: the try-it mode says so in its first log line
// and prints its generated admin token whatever --log-level says (API.md),
// --log-level error included.
func TestServeEmbeddedQuiet(t *testing.T) {
	logs := &logtest.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0", "--log-level", "error"},
			env(nil), &bytes.Buffer{}, logs)
	}()
	waittest.Until(t, 20*time.Second, "the admin token in the log", func() bool { return strings.Contains(logs.String(), "admin_token=") })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve returned %v after shutdown, want nil", err)
	}
	if first := strings.SplitN(logs.String(), "\n", 2)[0]; !strings.Contains(first, "embedded in-memory shards") {
		t.Fatalf("first log line %q does not say the shards are embedded", first)
	}
}

func testServeEmbedded(t *testing.T, args []string) {
	addr, logs := startServe(t, args, nil)
	first := strings.SplitN(logs.String(), "\n", 2)[0]
	if !strings.Contains(first, "embedded in-memory shards") {
		t.Fatalf("first log line %q does not say the shards are embedded", first)
	}
	i := strings.Index(logs.String(), "admin_token=")
	if i < 0 {
		t.Fatalf("no admin token printed:\n%s", logs)
	}
	token := strings.Fields(logs.String()[i+len("admin_token="):])[0]
	if code, _ := post(t, "http://"+addr+"/admin/pools", "", `{"pool_id":"p","total_cents":100,"count":2}`); code != 401 {
		t.Fatalf("preload without token = %d, want 401", code)
	}
	if code, body := post(t, "http://"+addr+"/admin/pools", token, `{"pool_id":"p","total_cents":100,"count":2}`); code != 201 {
		t.Fatalf("preload = %d %v, want 201", code, body)
	}
	code, g := post(t, "http://"+addr+"/grab", "", `{"pool_id":"p","user_id":"u1"}`)
	if code != 200 || g["status"] != "granted" {
		t.Fatalf("grab = %d %v, want 200 granted", code, g)
	}
	// The whole life: the in-process settle worker confirms the grant into
	// the ledger the log names; the pool ends and closes.
	if code, body := post(t, "http://"+addr+"/admin/pools/p/end", token, ""); code != 200 || body["state"] != "ended" {
		t.Fatalf("end = %d %v, want 200 ended", code, body)
	}
	var account map[string]any
	waittest.Until(t, 15*time.Second, "the pool closes once the in-process worker has settled its grant", func() bool {
		code, body := post(t, "http://"+addr+"/admin/pools/p/close", token, "")
		account = body
		return code == 200
	})
	if account["confirmed_count"] != float64(1) || account["confirmed_cents"] != g["amount_cents"] || account["unclaimed_count"] != float64(1) {
		t.Fatalf("account %v; want the one grant confirmed (%v cents), one packet unclaimed", account, g["amount_cents"])
	}
	i = strings.Index(logs.String(), "ledger=")
	if i < 0 {
		t.Fatalf("the log names no ledger:\n%s", logs)
	}
	b, err := os.ReadFile(strings.Fields(logs.String()[i+len("ledger="):])[0])
	if err != nil || !bytes.Contains(b, []byte(`"user_id":"u1"`)) {
		t.Fatalf("ledger %q, %v; want u1's grant", b, err)
	}
}

// durable is how the tests run shards for rain serve and rain settle: as
// production must (--durability strict).
var durable = redistest.Options{AOF: true, Fsync: "always"}

func TestServeRedisFromEnvAndTools(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	shards := fmt.Sprintf("a=1@%s,b=2@%s", servers[0].Addr, servers[1].Addr)
	environ := map[string]string{"RAIN_REDIS": shards, "RAIN_ADMIN_TOKEN": longToken}
	addr, logs := startServe(t, nil, environ)
	if strings.Contains(logs.String(), "embedded") {
		t.Fatalf("serve with RAIN_REDIS ran embedded:\n%s", logs)
	}

	// rain preload, then grabs through the server, then rain audit.
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"preload", "--pool", "cli", "--total-cents", "1000", "--count", "10"}, env(environ), &out, &errOut)
	if err != nil {
		t.Fatalf("rain preload: %v (%s)", err, errOut.String())
	}
	var st map[string]any
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st["remaining_count"] != float64(10) {
		t.Fatalf("rain preload printed %q, want a status with 10 remaining", out.String())
	}
	for i := range 3 {
		if code, body := post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"cli","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d %v, want 200", code, body)
		}
	}
	out.Reset()
	if err := run(context.Background(), []string{"audit", "--pool", "cli"}, env(environ), &out, &errOut); err != nil {
		t.Fatalf("rain audit of a sound pool: %v\n%s", err, out.String())
	}
	// Corrupt the stock: audit must say so and fail.
	for _, s := range servers {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		keys, _ := rdb.Keys(context.Background(), "rain:{cli:0}:stock").Result()
		if len(keys) == 1 {
			rdb.RPush(context.Background(), keys[0], 999)
		}
		rdb.Close()
	}
	out.Reset()
	err = run(context.Background(), []string{"audit", "--pool", "cli"}, env(environ), &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "stock_count") {
		t.Fatalf("rain audit of a corrupted pool = %v, want an error naming stock_count\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `"ok": false`) {
		t.Fatalf("rain audit printed %s, want ok false", out.String())
	}
}

func TestHelp(t *testing.T) {
	for _, cmd := range []string{"serve", "preload", "audit", "end", "close", "settle"} {
		var errOut bytes.Buffer
		if err := run(context.Background(), []string{cmd, "-h"}, env(nil), &bytes.Buffer{}, &errOut); err != nil {
			t.Errorf("rain %s -h = %v, want nil", cmd, err)
		}
		if !strings.Contains(errOut.String(), "-redis") {
			t.Errorf("rain %s -h printed %q, want the flags", cmd, errOut.String())
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "no command"},
		{[]string{"bogus"}, nil, "unknown command"},
		{[]string{"serve", "--redis", "s1=0@127.0.0.1:1"}, nil, "weight"},
		{[]string{"serve"}, map[string]string{"RAIN_REDIS": "s1=1@127.0.0.1:1"}, "admin-token"},
		{[]string{"serve", "--redis", "s1=1@127.0.0.1:1", "--admin-token", longToken, "--user-auth", "none", "--serial-shard", "zz"}, nil, "serial-shard"},
		{[]string{"serve", "--redis", "s1=1@127.0.0.1:1", "--admin-token", "short"}, nil, "openssl rand -hex 16"},
		{[]string{"serve", "--redis", "s1=1@127.0.0.1:1", "--admin-token", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, nil, "distinct"},
		{[]string{"serve", "--log-level", "loud"}, nil, "log-level"},
		{[]string{"serve", "--log-format", "xml"}, nil, "log-format"},
		{[]string{"serve", "--user-auth", "hs256"}, nil, "user auth"},
		{[]string{"serve", "--user-auth", "md5:/etc/hostname"}, nil, "unknown kind"},
		{[]string{"serve", "--user-auth", "hs256:/nonexistent/key"}, nil, "no such file"},
		{[]string{"serve", "--admin-token-file", "/nonexistent/tokens"}, nil, "admin token file"},
		{[]string{"serve", "--redis-ca", "/nonexistent/ca.pem", "--admin-token", longToken, "--redis", "s1=1@127.0.0.1:1", "--user-auth", "none"}, nil, "--redis-ca"},
		{[]string{"serve", "--redis", "s1=1@rediss://u:hunter2@127.0.0.1:99999", "--admin-token", longToken}, nil, "xxxxx"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--webhook", "https://127.0.0.1:1", "--webhook-secret-file", "/nonexistent"}, nil, "webhook-secret-file"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--webhook", "http://wallet.example/credit"}, nil, "--webhook-allow-http"},
		{[]string{"serve"}, map[string]string{"RAIN_SHUTDOWN_TIMEOUT": "soon"}, "RAIN_SHUTDOWN_TIMEOUT"},
		{[]string{"serve", "extra"}, nil, "unexpected arguments"},
		{[]string{"serve", "--workers", "maybe"}, nil, "--workers"},
		{[]string{"serve", "--pool", "maybe"}, nil, "--workers"}, // its old name
		{[]string{"serve", "--workers-min", "50", "--workers-max", "10"}, nil, "--workers-min 50 and --workers-max 10"},
		{[]string{"serve"}, map[string]string{"RAIN_WORKERS_QUEUE": "lots"}, "RAIN_WORKERS_QUEUE"},
		{[]string{"serve"}, map[string]string{"RAIN_POOL_QUEUE": "lots"}, "RAIN_POOL_QUEUE"}, // its old name
		{[]string{"preload", "--pool", "p"}, nil, "--redis"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1"}, nil, "exactly one"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--ledger", "x", "--webhook", "http://127.0.0.1:1"}, nil, "exactly one"},
		{[]string{"settle", "--redis", "s1=1@127.0.0.1:1", "--webhook", "ftp://x"}, nil, "--webhook"},
		{[]string{"audit", "--redis", "s1=1@127.0.0.1:1", "--pool", "bad id"}, nil, "--pool"},
		{[]string{"audit", "--redis", "s1=1@127.0.0.1:1", "--pool", "p", "--serial-shard", "zz"}, nil, `--serial-shard "zz"`},
		{[]string{"close", "--redis", "s1=1@127.0.0.1:1"}, nil, "--pool"},
		{[]string{"end", "--pool", "p"}, nil, "--redis"},
	} {
		err := run(context.Background(), tc.args, env(tc.env), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%v, env %v) = %v, want an error containing %q", tc.args, tc.env, err, tc.want)
		}
		if code := exitCode(err); code != exitUsage {
			t.Errorf("run(%v, env %v) = %v: exit code %d, want %d (usage)", tc.args, tc.env, err, code, exitUsage)
		}
	}
}

func TestSettleCommand(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	environ := map[string]string{
		"RAIN_REDIS":       shardtest.Flag(redistest.Addrs(servers)),
		"RAIN_ADMIN_TOKEN": longToken,
	}
	addr, _ := startServe(t, nil, environ)
	if code, body := post(t, "http://"+addr+"/admin/pools", longToken, `{"pool_id":"s","total_cents":500,"count":5}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	for i := range 5 {
		if code, body := post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"s","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d %v", code, body)
		}
	}
	ledger := t.TempDir() + "/ledger.jsonl"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logs := &logtest.Buffer{}
	go func() {
		done <- run(ctx, []string{"settle", "--ledger", ledger, "--consumer", "t1"}, env(environ), &bytes.Buffer{}, logs)
	}()
	t.Cleanup(func() { cancel() })
	waittest.Until(t, 15*time.Second, "5 lines in the ledger", func() bool {
		b, _ := os.ReadFile(ledger)
		return bytes.Count(b, []byte("\n")) == 5
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("rain settle returned %v after cancel, want nil", err)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/admin/pools/s", nil)
	req.Header.Set("Authorization", "Bearer "+longToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st map[string]any
	json.NewDecoder(resp.Body).Decode(&st)
	if st["confirmed_count"] != float64(5) {
		t.Fatalf("status after settling = %v, want 5 confirmed", st)
	}
}

// TestServeReaps: rain serve's reaper releases grants not confirmed by their
// deadline, and /metrics says so.
func TestServeReaps(t *testing.T) {
	// On shards of its own, with no settlement (embedded, rain serve runs
	// a settle worker, which confirms the grants).
	servers := redistest.StartN(t, 1, durable)
	token := longToken
	addr, _ := startServe(t, []string{"--redis", "a=1@" + servers[0].Addr, "--admin-token", token}, nil)
	if code, body := post(t, "http://"+addr+"/admin/pools", token, `{"pool_id":"r","total_cents":300,"count":3,"hold_seconds":1}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	for i := range 2 {
		if code, body := post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"r","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d %v", code, body)
		}
	}
	waittest.Until(t, 10*time.Second, "rain_reaper_released_total 2 (a 1s hold)", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return bytes.Contains(b, []byte("rain_reaper_released_total 2\n"))
	})
}

// TestDurability: rain serve and rain settle refuse shards that can lose an
// acknowledged grant on a host crash, naming the shard and the setting,
// unless --durability relaxed, which warns and shows in /metrics.
func TestDurability(t *testing.T) {
	good := redistest.Start(t, durable)
	everysec := redistest.Start(t, redistest.Options{AOF: true, Fsync: "everysec"})
	noAOF := redistest.Start(t, redistest.Options{})
	shards := fmt.Sprintf("a=1@%s,b=1@%s,c=1@%s", good.Addr, everysec.Addr, noAOF.Addr)
	for _, cmd := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "none"},
		{"settle", "--ledger", t.TempDir() + "/l"},
	} {
		err := run(context.Background(), append(cmd, "--redis", shards), env(nil), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("rain %s on an everysec and a no-AOF shard started, want a refusal", cmd[0])
		}
		for _, want := range []string{`shard b: appendfsync is "everysec"`, `shard c: appendonly is "no"`, "--durability relaxed"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rain %s refused with %q, want it to say %q", cmd[0], err, want)
			}
		}
		if strings.Contains(err.Error(), "shard a") {
			t.Errorf("rain %s refused with %q, which names the durable shard a", cmd[0], err)
		}
	}
	addr, logs := startServe(t, []string{"--durability", "relaxed"}, map[string]string{"RAIN_REDIS": shards, "RAIN_ADMIN_TOKEN": longToken})
	if !strings.Contains(logs.String(), `durability relaxed: shard b: appendfsync is \"everysec\"`) {
		t.Errorf("relaxed serve logged no warning naming shard b:\n%s", logs)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(b, []byte("rain_durability_relaxed 1\n")) {
		t.Errorf("/metrics under --durability relaxed lacks rain_durability_relaxed 1:\n%s", b)
	}
}

// TestIdleChatter: two idle rain serve instances on four shards, one pool
// of four sub-pools with grants held: every call each makes to each shard
// is counted at a proxy in front of it. Idle, an instance costs a shard at
// most 2 calls a second (docs/benchmarks.md#background-calls), and the count does
// not grow with the shards: the registries are read one shard in turn, the
// reaper sweeps a sub-pool only when its shard's due index says something
// there can be due, and a waiting instance tries the reaper's lock every
// few seconds.
func TestIdleChatter(t *testing.T) {
	a, proxies := idleRig(t)
	if code, body := post(t, "http://"+a+"/admin/pools", longToken, `{"pool_id":"idle","total_cents":10000,"count":100,"sub_pools":4}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	for i := range 20 {
		if code, _ := post(t, "http://"+a+"/grab", "", fmt.Sprintf(`{"pool_id":"idle","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d", code)
		}
	}
	assertIdle(t, proxies, 2*time.Second, 6*time.Second, "one pool, grants held")
}

// TestIdleSeason: a season preloaded ahead of its rains costs nothing while
// it waits. Four shards behind counting proxies, two rain serve instances,
// 400 pools of four sub-pools each: 200 whose window starts tomorrow, 200
// open with nothing held. Idle, each instance costs each shard at most 2
// calls a second, as one idle pool does (docs/benchmarks.md#background-calls):
// background work follows what there is to do, not the pools that exist.
func TestIdleSeason(t *testing.T) {
	a, proxies := idleRig(t)
	tomorrow := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	for i := range 400 {
		body := fmt.Sprintf(`{"pool_id":"p%d","total_cents":10000,"count":100,"sub_pools":4}`, i)
		if i%2 == 0 {
			body = fmt.Sprintf(`{"pool_id":"p%d","total_cents":10000,"count":100,"sub_pools":4,"starts_at":%q}`, i, tomorrow)
		}
		if code, resp := post(t, "http://"+a+"/admin/pools", longToken, body); code != 201 {
			t.Fatalf("preload p%d = %d %v", i, code, resp)
		}
	}
	assertIdle(t, proxies, 10*time.Second, 10*time.Second, "400 idle pools")
}

// idleRig is two rain serve instances on four shards, each behind a proxy
// that counts the calls it passes; it returns the first instance's address.
func idleRig(t *testing.T) (string, []*redisproxy.Proxy) {
	t.Helper()
	servers := redistest.StartN(t, 4, durable)
	var proxies []*redisproxy.Proxy
	var addrs []string
	for _, s := range servers {
		p := redisproxy.Start(t, s.Addr)
		proxies, addrs = append(proxies, p), append(addrs, p.Addr)
	}
	environ := map[string]string{"RAIN_REDIS": shardtest.Flag(addrs), "RAIN_ADMIN_TOKEN": longToken}
	a, _ := startServe(t, nil, environ)
	startServe(t, nil, environ)
	return a, proxies
}

// assertIdle lets the instances settle for warm (first sweeps, lock
// attempts, listings), then counts the calls each shard gets over window:
// at most 2 a second per instance.
func assertIdle(t *testing.T, proxies []*redisproxy.Proxy, warm, window time.Duration, what string) {
	t.Helper()
	time.Sleep(warm)
	for _, p := range proxies {
		p.ResetStats()
	}
	time.Sleep(window)
	for i, p := range proxies {
		st := p.Stats()
		perInstance := float64(st.Calls()) / 2 / window.Seconds()
		t.Logf("shard s%d: %.2f calls/s per instance: %v", i+1, perInstance, st.Commands)
		if perInstance > 2 {
			t.Errorf("shard s%d: %.2f calls/s per idle instance (%s), want at most 2 (%v)", i+1, perInstance, what, st.Commands)
		}
	}
}

// TestConnectionCap: a flood of idle keep-alive connections past
// --max-conns does not starve new clients: the idle ones are closed, a grab
// and the readiness probe on new connections are answered at once.
func TestConnectionCap(t *testing.T) {
	addr, logs := startServe(t, []string{"--max-conns", "40"}, nil)
	i := strings.Index(logs.String(), "admin_token=")
	token := strings.Fields(logs.String()[i+len("admin_token="):])[0]
	if code, body := post(t, "http://"+addr+"/admin/pools", token, `{"pool_id":"cap","total_cents":100,"count":10}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 100 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
		fmt.Fprintf(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n") // then idle, kept alive
	}
	// Every one of them was taken, and those over the cap closed.
	waittest.Until(t, 5*time.Second, "60 idle connections closed by the cap", func() bool {
		return metricValue(t, addr, "rain_http_connections_closed_total") >= 60
	})
	// Answered, not left to wait for an idle connection to time out (30 s,
	// past this client's timeout) or refused.
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := fresh.Post("http://"+addr+"/grab", "application/json", strings.NewReader(`{"pool_id":"cap","user_id":"u1"}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("grab on a new connection past the cap = %v, %v", resp, err)
	}
	resp.Body.Close()
	if resp, err = fresh.Get("http://" + addr + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("/readyz past the cap = %v, %v", resp, err)
	}
	resp.Body.Close()
	open, closed := metricValue(t, addr, "rain_http_connections"), metricValue(t, addr, "rain_http_connections_closed_total")
	if open > 40 || closed < 60 {
		t.Fatalf("after 100 idle connections and a cap of 40: %v open, %v closed; want at most 40 open, at least 60 closed", open, closed)
	}
}
