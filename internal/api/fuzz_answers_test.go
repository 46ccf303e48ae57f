package api

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"rain/internal/redistest"
)

// FuzzEveryAnswerIsJSON sends requests of every shape to the listener, as
// a client or a scanner may (any method, any request target, any headers
// and body; the connection's sending half closed after them), and checks
// what comes back: every redirect, refusal or error is JSON (API.md: every
// answer, the router's and the server's included), with a JSON body. The
// seeds are the answers net/http's own code and the adaptor wrote in plain
// text or HTML before (a path not clean, /admin, OPTIONS *, CONNECT, a
// malformed escape).
func FuzzEveryAnswerIsJSON(f *testing.F) {
	for _, seed := range [][4]string{
		{"GET", "/%zz", "", ""},
		{"POST", "/admin/pools/%zz/end", "Content-Length: 0\r\n", ""},
		{"CONNECT", "x:80", "", ""},
		{"OPTIONS", "*", "", ""},
		{"GET", "//healthz", "", ""},
		{"GET", "/admin", "", ""},
		{"POST", "/admin/pools/p1/../p1/end", "Content-Length: 0\r\n", ""},
		{"GET", "/nope", "", ""},
		{"GET", "/grab", "", ""},
		{"POST", "/grab", "Content-Type: application/json\r\nContent-Length: 31\r\n", `{"pool_id":"p","user_id":"u1"}`},
		{"POST", "/grab", "Content-Type: text/plain\r\nContent-Length: 2\r\n", "{}"},
		{"DELETE", "/admin/pools", "", ""},
		{"GET", "/admin/pools", "Authorization: Bearer nope\r\n", ""},
		{"POST", "/admin/pools", "Transfer-Encoding: chunked\r\n", "5\r\n{\"a\":\r\n0\r\n\r\n"},
		{"GET", "/healthz?x=%zz", "", ""},
		{"HEAD", "/nope", "", ""},
		{"GET", "http://x/healthz", "", ""},
		{"GET", "/admin/../../etc/passwd", "", ""},
		{"PATCH", "/readyz", "Expect: 100-continue\r\nContent-Length: 3\r\n", "abc"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	s := newStack(f, 1, redistest.Options{})
	// And a side listener (ServeApart) of a plain net/http mux, as rain
	// serve's --metrics-listen and rain settle's are.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("# metrics\n")) })
	f.Cleanup(ServeApart(ln, mux, WriteTimeout, time.Second, slog.New(slog.DiscardHandler)))
	addrs := []string{strings.TrimPrefix(s.url, "http://"), ln.Addr().String()}
	f.Fuzz(func(t *testing.T, method, target, headers, body string) {
		for _, addr := range addrs {
			answeredJSON(t, addr, method, target, headers, body)
		}
	})
}

// answeredJSON sends the request on a connection of its own to addr and
// checks its answer, if any (see FuzzEveryAnswerIsJSON).
func answeredJSON(t *testing.T, addr, method, target, headers, body string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// Closed with a reset: hundreds of thousands of runs would
	// otherwise hold every local port in TIME_WAIT.
	_ = conn.(*net.TCPConn).SetLinger(0)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	_, _ = conn.Write([]byte(method + " " + target + " HTTP/1.1\r\nHost: rain\r\n" + headers + "\r\n" + body))
	_ = conn.(*net.TCPConn).CloseWrite()
	br := bufio.NewReader(conn)
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(br, nil)
		if err != nil {
			// No answer: the server may close a connection that sent
			// nothing it could take for a request. Any answer it gives
			// is checked below.
			return
		}
		if resp.StatusCode >= 200 {
			break
		}
		resp.Body.Close() // 100 Continue: the answer comes after it
	}
	defer resp.Body.Close()
	code := resp.StatusCode
	if code < 300 || code == http.StatusNotModified {
		return // an endpoint's own answer (the dashboard's files and /metrics are not JSON)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: %q %q %q %q: answered %d with Content-Type %q, want application/json", addr, method, target, headers, body, code, ct)
	}
	if method == http.MethodHead {
		return // no body
	}
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s: %q %q %q %q: answered %d with a body that is not a JSON object: %v", addr, method, target, headers, body, code, err)
	}
}
