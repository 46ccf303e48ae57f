package api

import (
	"strings"
	"testing"

	"rain/internal/redistest"
)

// TestStrictContract: duplicate keys, field names in another case and
// windows under a second are refused with 400 and a reason, on /grab and on
// the operator endpoints, and nothing is claimed or loaded.
func TestStrictContract(t *testing.T) {
	s := newStack(t, 1, redistest.Options{})
	s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
	for _, c := range []struct{ path, auth, body, want string }{
		{"/grab", "", `{"pool_id":"p","user_id":"a","user_id":"b"}`, `duplicate key "user_id"`},
		{"/grab", "", `{"pool_id":"p","pool_id":"p","user_id":"a"}`, `duplicate key "pool_id"`},
		{"/grab", "", `{"POOL_ID":"p","user_id":"a"}`, `unknown field "POOL_ID"`},
		{"/grab", "", `{"pool_id":"p","User_Id":"a"}`, `unknown field "User_Id"`},
		{"/admin/pools", token, `{"pool_id":"q","total_cents":1000,"count":10,"count":20}`, `duplicate key "count"`},
		{"/admin/pools", token, `{"pool_id":"q","Total_Cents":1000,"count":10}`, `unknown field "Total_Cents"`},
		{"/admin/pools", token, `{"pool_id":"q","total_cents":1000,"count":10,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2030-01-01T00:00:00.0004Z"}`, "at least 1s"},
		{"/admin/pools", token, `{"pool_id":"q","total_cents":1000,"count":10,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2030-01-01T00:00:00.999Z"}`, "at least 1s"},
		{"/admin/pools", token, `{"pool_id":"q","total_cents":1000,"count":10,"starts_at":"2030-01-01T00:00:01Z","ends_at":"2030-01-01T00:00:00Z"}`, "at least 1s"},
		{"/admin/grants/confirm", token, `{"pool_id":"p","user_id":"a","serial":1,"serial":2}`, `duplicate key "serial"`},
	} {
		r := s.do(t, "POST", c.path, c.auth, c.body)
		if r.Code != 400 || !strings.Contains(r.Body["error"].(string), c.want) {
			t.Errorf("POST %s %s = %d %v, want 400 saying %q", c.path, c.body, r.Code, r.Body, c.want)
		}
		if c.path == "/grab" && r.Body["status"] != "invalid" {
			t.Errorf("POST /grab %s: status %v, want invalid", c.body, r.Body["status"])
		}
	}
	if st := s.do(t, "GET", "/admin/pools/p", token, ""); st.Body["remaining_count"] != float64(10) {
		t.Fatalf("pool after refused grabs = %v, want all 10 packets", st.Body)
	}
	if st := s.do(t, "GET", "/admin/pools/q", token, ""); st.Code != 404 {
		t.Fatalf("pool q after refused preloads = %d, want 404 (never loaded)", st.Code)
	}
	// A window of exactly a second is fine.
	if r := s.do(t, "POST", "/admin/pools", token, `{"pool_id":"w","total_cents":1000,"count":10,"starts_at":"2030-01-01T00:00:00Z","ends_at":"2030-01-01T00:00:01Z"}`); r.Code != 201 {
		t.Fatalf("a 1 s window = %d %v, want 201", r.Code, r.Body)
	}
}
