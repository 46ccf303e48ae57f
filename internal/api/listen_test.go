package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"rain/internal/redistest"
)

// TestOperatorBodies: on the listener, an operator request's body is read
// whole before its handler runs, chunked or not, up to maxAdminBody; a
// larger one is refused 400 saying so, and nothing is done.
func TestOperatorBodies(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	post := func(body io.Reader, length int64) response {
		t.Helper()
		req, err := http.NewRequest("POST", s.url+"/admin/pools", body)
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = length
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := s.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		r := response{Code: resp.StatusCode}
		_ = json.NewDecoder(resp.Body).Decode(&r.Body)
		return r
	}
	spec := `{"pool_id":"chunked","total_cents":1000,"count":10}`
	// A reader of unknown length is sent chunked.
	if r := post(io.MultiReader(strings.NewReader(spec)), -1); r.Code != 201 {
		t.Fatalf("a chunked preload = %d %v, want 201", r.Code, r.Body)
	}
	big := `{"pool_id":"big","total_cents":1000,"count":10,"x":"` + strings.Repeat("a", maxAdminBody) + `"}`
	for _, length := range []int64{int64(len(big)), -1} {
		if r := post(strings.NewReader(big), length); r.Code != 400 || !strings.Contains(fmt.Sprint(r.Body["error"]), "larger than") {
			t.Fatalf("a preload of %d bytes (length %d) = %d %v, want 400 saying it is too large", len(big), length, r.Code, r.Body)
		}
	}
	if r := s.do(t, "GET", "/admin/pools/big", token, ""); r.Code != 404 {
		t.Fatalf("GET /admin/pools/big after the refusals = %d %v, want 404", r.Code, r.Body)
	}
}

// TestIdleAndCutShort: a connection that sends nothing before the header
// deadline is closed without a word (an answer would reach a client that
// asked nothing, as an unsolicited response on its idle connection); one
// that sends part of a request and stops is answered 400, JSON, saying it
// did not arrive in time, and closed.
func TestIdleAndCutShort(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	dial := func(send string) <-chan string {
		t.Helper()
		c, err := net.Dial("tcp", s.api.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, send); err != nil {
			t.Fatal(err)
		}
		got := make(chan string, 1)
		go func() {
			_ = c.SetReadDeadline(time.Now().Add(3 * ReadHeaderTimeout))
			b, err := io.ReadAll(c)
			got <- fmt.Sprintf("%q %v", b, err)
		}()
		return got
	}
	idle, cut := dial(""), dial("GET /livez HTTP/1.1\r\nHost: x\r\n")
	if a := <-idle; a != `"" <nil>` {
		t.Errorf("an idle connection got %s, want closed without an answer", a)
	}
	if a := <-cut; !strings.Contains(a, "400 Bad Request") || !strings.Contains(a, `\"status\":\"invalid\"`) ||
		!strings.Contains(a, "did not arrive in time") {
		t.Errorf("a request cut short got %s, want 400 invalid saying it did not arrive in time", a)
	}
}
