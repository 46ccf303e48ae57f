package loadtest

// This file checks the k6 scripts in k6/ without k6, which may not be
// installable where the tests run, but with node, which is:
//
//   - TestK6Syntax: node --check parses every script (copied as .mjs, so node
//     reads it as the ES module k6 reads); TestK6SyntaxCheckBites proves that
//     a broken script fails it.
//   - TestK6Shape: each script exports options and a default function,
//     rain.js a handleSummary and a ramping-arrival-rate scenario, and every
//     import is a k6 module or a relative file that exists (no remote imports:
//     the scripts run offline).
//   - TestK6AgainstRain: k6/testdata/k6shim stands in for k6's modules (with
//     real, blocking HTTP) and plays each script's life cycle — init, setup(),
//     some iterations, teardown(), handleSummary() — against a real rain on
//     embedded shards. It catches what parsing cannot: a missing import, a
//     check that fails on a correct answer, an executor field k6 would refuse,
//     a threshold on a metric that does not exist.
//   - TestK6ChecksBite: the same scripts against a fake rain that answers
//     wrongly in known ways; the checks meant to catch each wrong answer fail.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// scripts are the k6 scripts users run; lib holds what they share.
var scripts = []string{"rain.js", "soak.js", "preload.js"}

// needNode returns the path of node, failing the test (never skipping it)
// when node is missing or too old for module hooks.
func needNode(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not on PATH: the k6 scripts are checked with node (k6 need not be installed); " +
			"install it (apt-get install -y nodejs, or brew install node) and run again")
	}
	out, err := exec.Command(node, "-p", `typeof require("node:module").register`).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "function" {
		t.Fatalf("%s has no module.register (want node ≥ 20.6): %s %v; install a newer nodejs and run again", node, out, err)
	}
	return node
}

// jsFiles lists the scripts and their library, relative to k6/.
func jsFiles(t *testing.T) []string {
	t.Helper()
	lib, err := filepath.Glob(filepath.Join("k6", "lib", "*.js"))
	if err != nil {
		t.Fatal(err)
	}
	files := slices.Clone(scripts)
	for _, l := range lib {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(l, "k6"+string(filepath.Separator))))
	}
	if len(lib) == 0 {
		t.Fatal("no k6/lib/*.js found")
	}
	return files
}

// nodeCheck runs node --check on a copy of src named .mjs, so that node
// parses it as an ES module whatever package.json says (there is none).
func nodeCheck(t *testing.T, node string, src []byte) ([]byte, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.mjs")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	return exec.Command(node, "--check", path).CombinedOutput()
}

func TestK6Syntax(t *testing.T) {
	node := needNode(t)
	for _, f := range jsFiles(t) {
		t.Run(f, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("k6", f))
			if err != nil {
				t.Fatal(err)
			}
			if out, err := nodeCheck(t, node, src); err != nil {
				t.Errorf("node --check %s: %v\n%s", f, err, out)
			}
		})
	}
}

// TestK6SyntaxCheckBites breaks copies of rain.js and expects node --check
// to refuse each, so that TestK6Syntax cannot pass by checking nothing.
func TestK6SyntaxCheckBites(t *testing.T) {
	node := needNode(t)
	src, err := os.ReadFile(filepath.Join("k6", "rain.js"))
	if err != nil {
		t.Fatal(err)
	}
	breaks := map[string]func(string) string{
		"unclosed brace": func(s string) string { return s[:strings.LastIndex(s, "}")] },
		"stray token": func(s string) string {
			return strings.Replace(s, "export const options = {", "export const options = {{", 1)
		},
		"CommonJS-only syntax in a module": func(s string) string { return s + "\nreturn 1;\n" },
	}
	for name, brk := range breaks {
		t.Run(name, func(t *testing.T) {
			broken := brk(string(src))
			if broken == string(src) {
				t.Fatal("the break changed nothing")
			}
			out, err := nodeCheck(t, node, []byte(broken))
			if err == nil || !strings.Contains(string(out), "SyntaxError") {
				t.Errorf("node --check of a broken rain.js: err = %v, output %q; want a SyntaxError", err, out)
			}
		})
	}
}

var importRE = regexp.MustCompile(`(?m)^\s*import\s+(?:[^'"]*?\s+from\s+)?['"]([^'"]+)['"]`)

func TestK6Shape(t *testing.T) {
	read := func(t *testing.T, f string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("k6", f))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, f := range scripts {
		t.Run(f, func(t *testing.T) {
			src := read(t, f)
			for _, want := range []string{"export const options", "export default function"} {
				if !strings.Contains(src, want) {
					t.Errorf("%s lacks %q", f, want)
				}
			}
		})
	}
	t.Run("rain.js", func(t *testing.T) {
		src := read(t, "rain.js")
		for _, want := range []string{
			"export function handleSummary",
			"'ramping-arrival-rate'",
			"export function setup",
			"http.setResponseCallback(http.expectedStatuses(200, 404, 410, 425, 429, 503))",
		} {
			if !strings.Contains(src, want) {
				t.Errorf("rain.js lacks %q", want)
			}
		}
	})
	t.Run("soak.js", func(t *testing.T) {
		if src := read(t, "soak.js"); !strings.Contains(src, "'constant-arrival-rate'") {
			t.Error("soak.js lacks a constant-arrival-rate scenario")
		}
	})
	t.Run("imports", func(t *testing.T) {
		for _, f := range jsFiles(t) {
			for _, m := range importRE.FindAllStringSubmatch(read(t, f), -1) {
				spec := m[1]
				switch {
				case spec == "k6" || strings.HasPrefix(spec, "k6/"):
				case strings.HasPrefix(spec, "./") || strings.HasPrefix(spec, "../"):
					p := filepath.Join("k6", filepath.Dir(f), spec)
					if _, err := os.Stat(p); err != nil {
						t.Errorf("%s imports %s: %v", f, spec, err)
					}
				default:
					t.Errorf("%s imports %s: only k6 modules and relative files (the scripts must run offline)", f, spec)
				}
			}
		}
	})
}

// shimReport is what k6shim/run.mjs writes.
type shimReport struct {
	Errors     []string           `json:"errors"`
	Logs       []string           `json:"logs"`
	Exports    []string           `json:"exports"`
	Iterations int                `json:"iterations"`
	Options    k6Options          `json:"options"`
	SetupData  map[string]any     `json:"setupData"`
	Checks     map[string]passes  `json:"checks"`
	Counters   map[string]float64 `json:"counters"`
	Thresholds map[string]struct {
		OK    bool     `json:"ok"`
		Value *float64 `json:"value"` // null for NaN
	} `json:"thresholds"`
	FailedRequests int               `json:"failedRequests"`
	Summary        map[string]string `json:"summary"`
}

type passes struct{ Passes, Fails int }

type k6Options struct {
	Scenarios map[string]struct {
		Executor        string `json:"executor"`
		StartRate       int    `json:"startRate"`
		Rate            int    `json:"rate"`
		Duration        string `json:"duration"`
		PreAllocatedVUs int    `json:"preAllocatedVUs"`
		MaxVUs          int    `json:"maxVUs"`
		Iterations      int    `json:"iterations"`
		Stages          []struct {
			Duration string `json:"duration"`
			Target   int    `json:"target"`
		} `json:"stages"`
	} `json:"scenarios"`
	Thresholds map[string]json.RawMessage `json:"thresholds"`
}

// runShim plays script for iterations iterations with env as k6's -e
// variables, and returns the report.
func runShim(t *testing.T, node, script string, iterations int, env map[string]string) shimReport {
	t.Helper()
	shim, err := filepath.Abs(filepath.Join("k6", "testdata", "k6shim"))
	if err != nil {
		t.Fatal(err)
	}
	scriptPath, err := filepath.Abs(filepath.Join("k6", script))
	if err != nil {
		t.Fatal(err)
	}
	envJSON, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	reportPath := filepath.Join(t.TempDir(), "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--import", "./register.mjs", "run.mjs", scriptPath, fmt.Sprint(iterations), reportPath)
	cmd.Dir = shim
	cmd.Env = append(os.Environ(), "K6SHIM_ENV="+string(envJSON))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node k6shim/run.mjs %s: %v\n%s", script, err, out)
	}
	b, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatalf("k6shim wrote no report: %v\n%s", err, out)
	}
	var r shimReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("k6shim report: %v\n%s", err, b)
	}
	if len(r.Errors) > 0 {
		t.Fatalf("%s under k6shim:\n%s\nlogs:\n%s", script, strings.Join(r.Errors, "\n"), strings.Join(r.Logs, "\n"))
	}
	return r
}

// allChecksPass fails the test for every check that failed at least once.
func allChecksPass(t *testing.T, r shimReport) {
	t.Helper()
	if len(r.Checks) == 0 {
		t.Error("no checks ran")
	}
	for name, c := range r.Checks {
		if c.Fails > 0 {
			t.Errorf("check %q: %d of %d failed", name, c.Fails, c.Passes+c.Fails)
		}
	}
	for name, th := range r.Thresholds {
		// A latency threshold is a speed target of a real run (k6 on its
		// own machine), not a property of the answers: on a shared CI
		// machine it is no test. wantThresholds checks it is declared, and
		// TestK6ChecksBite that a threshold that fails is reported.
		if !th.OK && !strings.HasPrefix(name, "http_req_duration") {
			t.Errorf("threshold %s failed (value %s)", name, thresholdValue(th.Value))
		}
	}
	if r.FailedRequests > 0 {
		t.Errorf("%d requests counted in http_req_failed", r.FailedRequests)
	}
}

// thresholdValue is a threshold's value as the shim reported it (nil: NaN).
func thresholdValue(v *float64) string {
	if v == nil {
		return "NaN"
	}
	return fmt.Sprint(*v)
}

func wantThresholds(t *testing.T, r shimReport, metrics ...string) {
	t.Helper()
	for _, m := range metrics {
		if _, ok := r.Options.Thresholds[m]; !ok {
			t.Errorf("no threshold on %s; have %v", m, keys(r.Options.Thresholds))
		}
	}
}

func keys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// wantSummary checks handleSummary's outputs: a text on stdout and the JSON
// summary at SUMMARY, carrying k6's metrics.
func wantSummary(t *testing.T, r shimReport, path string) {
	t.Helper()
	if !strings.Contains(r.Summary["stdout"], "rain k6 summary") {
		t.Errorf("handleSummary stdout = %q, want the text summary", r.Summary["stdout"])
	}
	var js struct {
		Metrics map[string]any `json:"metrics"`
		Rain    map[string]any `json:"rain"`
	}
	if err := json.Unmarshal([]byte(r.Summary[path]), &js); err != nil {
		t.Fatalf("handleSummary output %s is not JSON: %v (outputs %v)", path, err, keys(r.Summary))
	}
	if len(js.Metrics) == 0 || js.Rain["script"] == nil {
		t.Errorf("summary JSON has %d metrics and rain = %v", len(js.Metrics), js.Rain)
	}
}

// startRain builds cmd/rain and runs `rain serve` on embedded in-memory
// shards on a free port of 127.0.0.1, with args besides; it returns the
// base URL.
func startRain(t *testing.T, token string, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rain")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rain")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rain: %v\n%s", err, out)
	}
	logs := &logWatch{addr: make(chan string, 1)}
	// The address comes from rain's "serving" log line, logged at info.
	cmd := exec.Command(bin, append([]string{"serve", "--listen", "127.0.0.1:0", "--admin-token", token, "--log-level", "info"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("rain's log:\n%s", logs.String())
		}
	})
	var base string
	select {
	case addr := <-logs.addr:
		base = "http://" + addr
	case <-time.After(30 * time.Second):
		t.Fatalf("rain serve did not log its address in 30s:\n%s", logs.String())
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(base + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("rain at %s not ready in 10s: %v", base, err)
		}
	}
}

// logWatch collects rain's log and hands over the address of its "serving"
// line once. exec.Cmd writes to it from one goroutine; String may be called
// from another.
type logWatch struct {
	mu   sync.Mutex // guards buf and sent
	buf  bytes.Buffer
	sent bool
	addr chan string // receives the serving address once
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.sent {
		if m := servingRE.FindSubmatch(w.buf.Bytes()); m != nil {
			w.sent = true
			w.addr <- string(m[1])
		}
	}
	return len(p), nil
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestK6AgainstRain(t *testing.T) {
	node := needNode(t)
	const token = "k6check-token"
	base := startRain(t, token)
	env := func(kv ...string) map[string]string {
		m := map[string]string{"BASE_URL": base, "ADMIN_TOKEN": token, "SUMMARY": "out/summary.json"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}

	t.Run("rain.js sells out", func(t *testing.T) {
		// 20 packets, 60 taps, 30% repeats: grants, repeats and sold_out.
		r := runShim(t, node, "rain.js", 60, env("PACKETS", "20", "TOTAL_CENTS", "2000", "REPEAT", "0.3", "RATE", "20000"))
		allChecksPass(t, r)
		sc, ok := r.Options.Scenarios["rain"]
		if !ok || sc.Executor != "ramping-arrival-rate" {
			t.Fatalf("scenarios = %+v, want rain: ramping-arrival-rate", r.Options.Scenarios)
		}
		peak := 0
		for _, st := range sc.Stages {
			peak = max(peak, st.Target)
		}
		if peak != 20000 || sc.StartRate >= peak || sc.MaxVUs < sc.PreAllocatedVUs {
			t.Errorf("rain scenario = %+v, want a spike from below to RATE=20000 with maxVUs ≥ preAllocatedVUs", sc)
		}
		wantThresholds(t, r, "http_req_duration{endpoint:grab}", "http_req_failed", "dropped_iterations", "checks")
		if got := r.Counters["rain_grab_granted"]; got != 20 {
			t.Errorf("rain_grab_granted = %v, want 20 (every packet)", got)
		}
		if r.Counters["rain_granted_cents"] != 2000 {
			t.Errorf("rain_granted_cents = %v, want 2000 (the whole pool)", r.Counters["rain_granted_cents"])
		}
		for _, c := range []string{"rain_grab_already_granted", "rain_grab_sold_out"} {
			if r.Counters[c] == 0 {
				t.Errorf("%s = 0, want some (counters %v)", c, r.Counters)
			}
		}
		if r.Checks["repeat: already_granted, same amount_cents and serial"].Passes == 0 {
			t.Error("no repeat of a granted user was checked")
		}
		if r.Checks["audit: ok, no problems"].Passes != 1 {
			t.Error("teardown did not audit the pool")
		}
		wantSummary(t, r, "out/summary.json")
	})

	t.Run("rain.js before the start", func(t *testing.T) {
		r := runShim(t, node, "rain.js", 10, env("PACKETS", "10", "START_IN", "3600", "SUMMARY", "-"))
		allChecksPass(t, r)
		if r.Counters["rain_grab_not_started"] != 10 || r.Checks["not_started: Retry-After"].Passes != 10 {
			t.Errorf("counters %v, checks %v: want 10 not_started with Retry-After", r.Counters, r.Checks)
		}
		if _, ok := r.Summary["-"]; ok {
			t.Error(`SUMMARY=- wrote a file named "-"`)
		}
	})

	t.Run("rain.js on a given pool twice", func(t *testing.T) {
		e := env("POOL", "k6check-given", "PACKETS", "5", "TOTAL_CENTS", "500", "PREFIX", "first")
		runShim(t, node, "rain.js", 3, e) // 201
		e["PREFIX"] = "second"
		r := runShim(t, node, "rain.js", 3, e) // the same spec: 200
		allChecksPass(t, r)
		if r.SetupData["pool_id"] != "k6check-given" || !slices.ContainsFunc(r.Logs, func(l string) bool {
			return strings.Contains(l, "already loaded")
		}) {
			t.Errorf("setup data %v, logs %q: want the given pool, already loaded", r.SetupData, r.Logs)
		}
	})

	t.Run("soak.js", func(t *testing.T) {
		r := runShim(t, node, "soak.js", 30, env("RATE", "50", "DURATION", "1m"))
		allChecksPass(t, r)
		sc := r.Options.Scenarios["soak"]
		if sc.Executor != "constant-arrival-rate" || sc.Rate != 50 || sc.Duration != "1m" {
			t.Errorf("soak scenario = %+v, want constant-arrival-rate 50/s for 1m", sc)
		}
		wantThresholds(t, r, "http_req_duration{endpoint:grab}", "http_req_failed", "dropped_iterations", "checks")
		if r.Counters["rain_grab_granted"] == 0 || r.Counters["rain_grab_sold_out"] != 0 {
			t.Errorf("counters %v: want grants and no sold_out (the soak pool fits every arrival)", r.Counters)
		}
		wantSummary(t, r, "out/summary.json")
	})

	t.Run("preload.js", func(t *testing.T) {
		r := runShim(t, node, "preload.js", 3, env("POOLS", "3", "PACKETS", "1000", "SUB_POOLS", "2"))
		allChecksPass(t, r)
		for _, c := range []string{
			"preload without the token: 401", "preload: 201 created", "status: every packet in stock",
			"status: sub-pools add up", "audit: ok, no problems", "preload again, same spec: 200",
			"preload again, another spec: 409",
		} {
			if r.Checks[c].Passes != 3 {
				t.Errorf("check %q passed %d times, want 3 (once per pool)", c, r.Checks[c].Passes)
			}
		}
		if sc := r.Options.Scenarios["operators"]; sc.Iterations != 3 {
			t.Errorf("operators scenario = %+v, want 3 iterations (POOLS)", sc)
		}
		wantSummary(t, r, "out/summary.json")
	})
}

// fakeRain answers the operator calls plausibly and each grab wrongly in
// a known way, picked by the grab's number; a user once granted properly
// is granted again with another serial (a double grant).
func fakeRain(t *testing.T) string {
	t.Helper()
	var mu sync.Mutex // guards n and granted
	n := 0
	granted := map[string]bool{}
	reply := func(w http.ResponseWriter, code int, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		fmt.Fprintln(w, body)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { reply(w, 200, `{"status":"ready"}`) })
	mux.HandleFunc("POST /admin/pools", func(w http.ResponseWriter, r *http.Request) { reply(w, 201, `{}`) })
	mux.HandleFunc("GET /admin/pools/{id}", func(w http.ResponseWriter, r *http.Request) { reply(w, 200, `{}`) })
	mux.HandleFunc("GET /admin/pools/{id}/audit", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, `{"ok":false,"problems":[{"quantity":"count","expected":1,"found":2}]}`)
	})
	mux.HandleFunc("POST /grab", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			PoolID string `json:"pool_id"`
			UserID string `json:"user_id"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			reply(w, 400, `{"status":"invalid","error":"bad json"}`)
			return
		}
		mu.Lock()
		i := n
		n++
		again := granted[body.UserID]
		mu.Unlock()
		ids := fmt.Sprintf(`"pool_id":%q,"user_id":%q`, body.PoolID, body.UserID)
		grant := fmt.Sprintf(`"amount_cents":100,"serial":%d,"expires_at":%q`, 1000+i,
			time.Now().Add(10*time.Minute).UTC().Format(time.RFC3339))
		if again {
			reply(w, 200, `{"status":"granted",`+ids+`,`+grant+`}`)
			return
		}
		switch i % 7 {
		case 0: // right: remembered, so a repeat of this user is a double grant
			mu.Lock()
			granted[body.UserID] = true
			mu.Unlock()
			reply(w, 200, `{"status":"granted",`+ids+`,`+grant+`}`)
		case 1:
			reply(w, 200, `{"status":"granted",`+ids+`,"amount_cents":100}`)
		case 2: // shed before the body was read: no ids
			reply(w, 503, `{"status":"overloaded","pool_id":"","user_id":"","error":"overloaded"}`)
		case 3:
			reply(w, 410, `{"status":"granted",`+ids+`,`+grant+`}`)
		case 4:
			reply(w, 200, `{"status":"yay",`+ids+`}`)
		case 5:
			reply(w, 410, `{"status":"sold_out",`+ids+`,`+grant+`}`)
		case 6:
			reply(w, 404, `{"status":"not_found","pool_id":"another","user_id":"someone"}`)
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestK6ChecksBite(t *testing.T) {
	node := needNode(t)

	t.Run("wrong answers", func(t *testing.T) {
		r := runShim(t, node, "rain.js", 14, map[string]string{
			"BASE_URL": fakeRain(t), "ADMIN_TOKEN": "x", "REPEAT": "0", "SUMMARY": "-",
		})
		for _, c := range []string{
			"granted: amount_cents, serial, expires_at", // 1: no serial
			"overloaded: Retry-After",                   // 2: no Retry-After
			"granted: HTTP 200",                         // 3: a grant with 410
			"grab: a status of docs/api.md",             // 4: "yay"
			"sold_out: no grant fields",                 // 5: sold_out with a grant
			"not_found: echoes pool_id and user_id",     // 6: ids of someone else
			"audit: ok, no problems",                    // teardown: ok:false
		} {
			if r.Checks[c].Fails == 0 {
				t.Errorf("check %q never failed on a wrong answer (checks %v)", c, r.Checks)
			}
		}
		if c := "overloaded: echoes pool_id and user_id"; r.Checks[c].Fails != 0 {
			t.Errorf("check %q failed on a shed answered before the body was read (checks %v)", c, r.Checks)
		}
		if r.Counters["rain_grab_other"] != 2 {
			t.Errorf("rain_grab_other = %v, want 2 (the two yays)", r.Counters["rain_grab_other"])
		}
		if th := r.Thresholds["checks rate>0.99"]; th.OK {
			t.Error("the checks threshold passed on wrong answers")
		}
	})

	t.Run("double grant", func(t *testing.T) {
		// REPEAT=1: after the first (right) grant, every tap repeats that
		// user, and the fake grants it again each time.
		r := runShim(t, node, "rain.js", 10, map[string]string{
			"BASE_URL": fakeRain(t), "ADMIN_TOKEN": "x", "REPEAT": "1", "SUMMARY": "-",
		})
		if c := r.Checks["repeat: already_granted, same amount_cents and serial"]; c.Fails != 9 {
			t.Errorf("repeat check = %+v, want 9 fails", c)
		}
		if got := r.Counters["rain_grab_double_grants"]; got != 9 {
			t.Errorf("rain_grab_double_grants = %v, want 9", got)
		}
		if th := r.Thresholds["rain_grab_double_grants count<1"]; th.OK {
			t.Error("the double-grant threshold passed on double grants")
		}
	})
}

// TestK6WithUserTokens: with USER_SECRET_FILE, rain.js signs an HS256 user
// token for every user (k6's own crypto) and grabs through rain serve
// --user-auth, the production path: every grab is decided, none refused
// unauthorized; with another secret, every grab is refused 401.
func TestK6WithUserTokens(t *testing.T) {
	node := needNode(t)
	const token = "k6check-token"
	dir := t.TempDir()
	secret, other := filepath.Join(dir, "secret"), filepath.Join(dir, "other")
	if err := os.WriteFile(secret, []byte("k6check-user-secret-k6check-user-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte("not-the-secret-not-the-secret-not-the-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startRain(t, token, "--user-auth", "hs256:"+secret, "--user-auth-audience", "rain-app", "--user-auth-issuer", "login")
	env := map[string]string{"BASE_URL": base, "ADMIN_TOKEN": token, "SUMMARY": "-", "PACKETS": "20", "TOTAL_CENTS": "2000",
		"REPEAT": "0.3", "USER_SECRET_FILE": secret, "USER_AUDIENCE": "rain-app", "USER_ISSUER": "login"}
	r := runShim(t, node, "rain.js", 40, env)
	allChecksPass(t, r)
	if r.Counters["rain_grab_granted"] != 20 || r.Counters["rain_grab_unauthorized"] != 0 {
		t.Fatalf("counters %v: want the 20 packets granted to signed users, none unauthorized", r.Counters)
	}
	env["USER_SECRET_FILE"], env["POOL"] = other, "k6check-other-secret"
	r = runShim(t, node, "rain.js", 10, env)
	if r.Counters["rain_grab_unauthorized"] != 10 || r.Counters["rain_grab_granted"] != 0 {
		t.Fatalf("counters %v: want every grab signed with another secret refused unauthorized", r.Counters)
	}
}
