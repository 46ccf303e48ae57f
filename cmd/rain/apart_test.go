package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/metrics"
	"rain/internal/wait/waittest"
)

// apartAddr is the address rain serve's side listener of --flag reports
// in its log (it listens on port 0).
func apartAddr(t *testing.T, logs *logtest.Buffer, flag string) string {
	t.Helper()
	re := regexp.MustCompile(`flag=` + flag + ` addr=(\S+)`)
	var addr string
	waittest.Until(t, 5*time.Second, "--"+flag+"'s address in the log", func() bool {
		m := re.FindStringSubmatch(logs.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// get is GET url with the admin token (when not empty): the status and the
// body.
func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminListen: with --admin-listen the operator API and the dashboard
// are served there, and the clients' listener answers 404 for them; grabs
// stay on --listen.
func TestAdminListen(t *testing.T) {
	addr, logs := startServe(t, []string{"--admin-token", longToken, "--admin-listen", "127.0.0.1:0"}, nil)
	admin := "http://" + apartAddr(t, logs, "admin-listen")
	pool := `{"pool_id":"a","total_cents":100,"count":10}`
	if code, body := post(t, "http://"+addr+"/admin/pools", longToken, pool); code != 404 {
		t.Fatalf("preload on --listen with --admin-listen = %d %v, want 404", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/admin/", ""); code != 404 {
		t.Fatalf("the dashboard on --listen = %d, want 404", code)
	}
	if code, body := post(t, admin+"/admin/pools", longToken, pool); code != 201 {
		t.Fatalf("preload on --admin-listen = %d %v, want 201", code, body)
	}
	if code, _ := get(t, admin+"/admin/", ""); code != 200 {
		t.Fatalf("the dashboard on --admin-listen = %d, want 200", code)
	}
	if code, body := post(t, admin+"/grab", "", `{"pool_id":"a","user_id":"u"}`); code != 404 {
		t.Fatalf("grab on --admin-listen = %d %v, want 404", code, body)
	}
	if code, body := post(t, "http://"+addr+"/grab", "", `{"pool_id":"a","user_id":"u"}`); code != 200 {
		t.Fatalf("grab on --listen = %d %v, want 200", code, body)
	}
}

// TestDebugListener: pprof on --debug-listen answers only the admin token,
// and never the command line, where a secret given as a flag (here the
// admin token itself) would show.
func TestDebugListener(t *testing.T) {
	_, logs := startServe(t, []string{"--admin-token", longToken, "--debug-listen", "127.0.0.1:0"}, nil)
	debug := "http://" + apartAddr(t, logs, "debug-listen")
	for _, path := range []string{"/debug/pprof/cmdline", "/debug/pprof/heap?debug=1", "/debug/pprof/"} {
		if code, _ := get(t, debug+path, ""); code != 401 {
			t.Errorf("GET %s without the admin token = %d, want 401", path, code)
		}
	}
	if code, body := get(t, debug+"/debug/pprof/cmdline", longToken); code != 404 || strings.Contains(body, longToken) {
		t.Errorf("GET /debug/pprof/cmdline with the admin token = %d %q, want 404 and no command line", code, body)
	}
	if code, _ := get(t, debug+"/debug/pprof/heap?debug=1", longToken); code != 200 {
		t.Errorf("GET /debug/pprof/heap with the admin token = %d, want 200", code)
	}
}

// TestSideListenersTimeouts: the side listeners keep the main one's
// limits: an idle keep-alive connection is closed after --idle-timeout,
// and one that never finishes its headers is closed too, so a client
// cannot hold them open.
func TestSideListenersTimeouts(t *testing.T) {
	flags := []string{"admin-listen", "metrics-listen", "debug-listen"}
	args := []string{"--admin-token", longToken, "--idle-timeout", "300ms"}
	for _, f := range flags {
		args = append(args, "--"+f, "127.0.0.1:0")
	}
	_, logs := startServe(t, args, nil)
	paths := map[string]string{"admin-listen": "/admin/pools", "metrics-listen": "/metrics", "debug-listen": "/debug/pprof/"}
	slow := map[string]net.Conn{}
	for _, f := range flags {
		c, err := net.Dial("tcp", apartAddr(t, logs, f))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: rain\r\n", paths[f]) // and never the end of the headers
		slow[f] = c
	}
	for _, f := range flags {
		c, err := net.Dial("tcp", apartAddr(t, logs, f))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: rain\r\nAuthorization: Bearer %s\r\n\r\n", paths[f], longToken)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("--%s: %v", f, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		// Closed within the read deadline (10 s): by --idle-timeout (300ms),
		// not the default's 30 s.
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("--%s: an idle keep-alive connection read %v, want closed by the server (EOF)", f, err)
		}
	}
	for _, f := range flags {
		_ = slow[f].SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.ReadAll(slow[f]); err != nil {
			t.Errorf("--%s: a request whose headers never end: %v, want the connection closed", f, err)
		}
	}
}

// TestMetricsListenAnswersJSON: the metrics listener serves GET /metrics
// (Prometheus text), and answers anything else as every answer of rain is
// (API.md): JSON, 404 for another path, 405 for another method.
func TestMetricsListenAnswersJSON(t *testing.T) {
	_, logs := startServe(t, []string{"--admin-token", longToken, "--metrics-listen", "127.0.0.1:0"}, nil)
	m := "http://" + apartAddr(t, logs, "metrics-listen")
	if code, body := get(t, m+"/metrics", ""); code != 200 || !strings.Contains(body, "rain_build_info") {
		t.Fatalf("GET /metrics = %d %.80q, want 200 and the metrics", code, body)
	}
	for _, c := range []struct {
		method, path string
		code         int
	}{{"GET", "/nothing", 404}, {"POST", "/metrics", 405}, {"GET", "/", 404}} {
		req, _ := http.NewRequest(c.method, m+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]string
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.code || derr != nil || body["error"] == "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s on --metrics-listen = %d %s (%v, %v), want %d JSON with an error", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), body, derr, c.code)
		}
	}
}

// refused sends raw on a new connection to addr and checks the answer:
// code, JSON with an error (API.md: every answer of rain's, the server's
// own included), and the connection closed after it.
func refused(t *testing.T, addr, what, raw string, code int) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s on %s: %v", what, addr, err)
	}
	var body map[string]string
	derr := json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != code || derr != nil || body["error"] == "" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("%s on %s = %d %s (%v, %v), want %d JSON with an error", what, addr, resp.StatusCode,
			resp.Header.Get("Content-Type"), body, derr, code)
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Errorf("%s on %s: %v after the answer, want the connection closed", what, addr, err)
	}
}

// TestSideListenersRefuseInJSON: what a side listener's server refuses
// before any route (headers too large, a request it cannot parse, no
// Host) is answered as the API's listener answers it, JSON with a reason;
// and pprof's bound on a profile's length holds there.
func TestSideListenersRefuseInJSON(t *testing.T) {
	flags := []string{"admin-listen", "metrics-listen", "debug-listen"}
	args := []string{"--admin-token", longToken}
	for _, f := range flags {
		args = append(args, "--"+f, "127.0.0.1:0")
	}
	_, logs := startServe(t, args, nil)
	big := strings.Repeat("x", 20<<10)
	for _, f := range flags {
		addr := apartAddr(t, logs, f)
		refused(t, addr, "headers of 20 KiB", "GET /metrics HTTP/1.1\r\nHost: rain\r\nX-Big: "+big+"\r\n\r\n", 431)
		refused(t, addr, "a request line that is not HTTP", "NOT HTTP AT ALL\r\n\r\n", 400)
		refused(t, addr, "HTTP/1.1 without Host", "GET /metrics HTTP/1.1\r\n\r\n", 400)
		refused(t, addr, "a malformed escape in the path", "GET /%zz HTTP/1.1\r\nHost: rain\r\n\r\n", 400)
	}
	// net/http's own answers in the side listeners' handlers: JSON too.
	if code, body := get(t, "http://"+apartAddr(t, logs, "debug-listen")+"/debug/pprof/nothing", longToken); code != 404 || !strings.Contains(body, `"error":"Unknown profile"`) {
		t.Errorf("an unknown profile on --debug-listen = %d %q, want 404 with pprof's reason in JSON", code, body)
	}
	debug := "http://" + apartAddr(t, logs, "debug-listen")
	if code, body := get(t, debug+"/debug/pprof/profile?seconds=3600", longToken); code != 400 {
		t.Errorf("a profile of an hour on --debug-listen = %d %.100q, want 400 (over 2 minutes)", code, body)
	}
	if code, body := get(t, debug+"/debug/pprof/trace?seconds=60", longToken); code != 400 {
		t.Errorf("a trace of a minute on --debug-listen = %d %.100q, want 400 (over 10 s)", code, body)
	}
	req, _ := http.NewRequest("POST", debug+"/debug/pprof/profile", strings.NewReader("seconds=3600"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+longToken)
	client := &http.Client{Timeout: 10 * time.Second}
	if resp, err := client.Do(req); err != nil || resp.StatusCode != 400 {
		t.Errorf("a profile of an hour asked in a form body = %v %v, want 400", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestSettleHealthListener: rain settle's listener serves /healthz and
// /metrics, and refuses as rain serve's listeners do.
func TestSettleHealthListener(t *testing.T) {
	logs := &logtest.Buffer{}
	stop, err := serveHealth("127.0.0.1:0", metrics.New(metrics.Build{}), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	m := regexp.MustCompile(`msg=serving addr=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no address in the log: %s", logs.String())
	}
	if code, body := get(t, "http://"+m[1]+"/healthz", ""); code != 200 || body != "ok\n" {
		t.Errorf("GET /healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, "http://"+m[1]+"/metrics", ""); code != 200 || !strings.Contains(body, "# TYPE") {
		t.Errorf("GET /metrics = %d %.80q, want 200 and the metrics", code, body)
	}
	if code, body := get(t, "http://"+m[1]+"/nothing", ""); code != 404 || !strings.Contains(body, `"error":"404 page not found"`) {
		t.Errorf("GET /nothing = %d %q, want 404 in JSON", code, body)
	}
	refused(t, m[1], "headers of 20 KiB", "GET /healthz HTTP/1.1\r\nHost: rain\r\nX-Big: "+strings.Repeat("x", 20<<10)+"\r\n\r\n", 431)
}
