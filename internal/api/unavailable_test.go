package api

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"rain/internal/redistest"
)

// TestUnavailableNamesNoAddress: with a real redis-server shard killed,
// every answer that needs it is a 503 whose body names the shard, never
// its address: a shard's address is the operator's business (their logs
// and the admin details of /readyz carry it), not a client's. The grab and
// every operator endpoint are asked.
func TestUnavailableNamesNoAddress(t *testing.T) {
	s := newStack(t, 2, redistest.Options{})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10,"sub_pools":2}`)
	victim := s.servers[1] // s2, which holds one of p's sub-pools
	_, port, err := net.SplitHostPort(victim.Addr)
	if err != nil {
		t.Fatal(err)
	}
	victim.Kill()
	calls := [][3]string{
		{"POST", "/grab", `{"pool_id":"p","user_id":"u1"}`},
		{"POST", "/grab", `{"pool_id":"p","user_id":"u2"}`},
		{"POST", "/admin/pools", `{"pool_id":"q","total_cents":1000,"count":10,"sub_pools":2}`},
		{"GET", "/admin/pools/p", ""},
		{"GET", "/admin/pools/p/audit", ""},
		{"POST", "/admin/pools/p/end", ""},
		{"POST", "/admin/pools/p/close", ""},
		{"POST", "/admin/grants/confirm", `{"pool_id":"p","user_id":"u1","serial":1}`},
	}
	unavailable := 0
	for _, c := range calls {
		code, body := s.raw(t, c[0], c[1], token, c[2])
		if code != http.StatusServiceUnavailable {
			continue // answered by the shard that runs, or without Redis
		}
		unavailable++
		t.Logf("%s %s = 503 %s", c[0], c[1], strings.TrimSpace(body))
		if strings.Contains(body, victim.Addr) || strings.Contains(body, ":"+port) || strings.Contains(body, "127.0.0.1") {
			t.Errorf("%s %s = 503 %s: names the shard's address (%s)", c[0], c[1], strings.TrimSpace(body), victim.Addr)
		}
		if !strings.Contains(body, `"error":"`) {
			t.Errorf("%s %s = 503 %s: no error saying why", c[0], c[1], strings.TrimSpace(body))
		}
	}
	if unavailable < len(calls)-2 {
		t.Fatalf("%d of %d calls answered 503 with a shard of their pool killed, want nearly all", unavailable, len(calls))
	}
}

// raw is the status and the body, as sent, of a request.
func (s *stack) raw(t *testing.T, method, path, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+auth)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
