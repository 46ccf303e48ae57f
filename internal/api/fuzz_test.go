package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"rain"
	"rain/internal/grab"
)

// FuzzDecodeGrab: the decoder never panics; what it accepts has valid ids,
// fits the size limit and survives a round trip; a body over the limit is
// always refused.
func FuzzDecodeGrab(f *testing.F) {
	for _, seed := range []string{
		`{"pool_id":"cny2027","user_id":"u_123456"}`,
		` {"user_id":"a:b.c-d_e","pool_id":"P"} `,
		`{"pool_id":"p","user_id":"u","x":1}`,
		`{"pool_id":"p","user_id":"u"}{}`,
		`{"pool_id":"p","pool_id":"q","user_id":"u"}`,
		`{"pool_id":"\u0070","user_id":"u"}`,
		`{"user_id":"u","pool_id":"p"}`,
		"{\n\t\"pool_id\" : \"p\" ,\r\n \"user_id\":\"u\"}\n",
		`{"pool_id":"p","user_id":"u",}`,
		`{"pool_id":"p","user_id":"u"`,
		`{"pool_id":"p","user_id":""}`,
		`{"pool_id":"p","user_id":"u"} {}`,
		`{"pool_id":"p","user_id":"u\u0041"}`,
		`{"pool_id":"p","user_id":"u","user_id":"v"}`,
		`{"POOL_ID":"p","user_id":"u"}`,
		`{"pool_id":"p","USER_id":"u"}`,
		`{"pool_id":"p","user_id":"u","pool_id":"p"}`,
		`{"pool_id":"p"}`,
		` { "pool_id" : "p" } `,
		`null`, `[]`, `""`, `{`, ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The fast path never accepts what the strict decoder would not,
		// and reads the same ids.
		if fast, ok := fastGrab(body); ok {
			var strict grabRequest
			if err := decodeStrict(body, &strict); err != nil || strict != fast {
				t.Fatalf("fastGrab(%q) = %+v; the strict decoder says %+v, %v", body, fast, strict, err)
			}
		}
		// Whatever encoding/json would read, a body with a key twice or in
		// another case is refused.
		if keys, ok := topKeys(body); ok {
			seen := map[string]bool{}
			for _, k := range keys {
				if seen[k] || (k != "pool_id" && k != "user_id") {
					if req, err := decodeGrab(bytes.NewReader(body), false); err == nil {
						t.Fatalf("decodeGrab(%q) accepted %+v despite key %q", body, req, k)
					}
				}
				seen[k] = true
			}
		}
		// With user auth on, user_id may be left out; present, it is checked
		// as ever, and what is accepted without auth is accepted with it.
		opt, optErr := decodeGrab(bytes.NewReader(body), true)
		if optErr == nil && opt.UserID != "" && !rain.ValidID(opt.UserID) {
			t.Fatalf("decodeGrab(%q, user optional) accepted invalid user %+v", body, opt)
		}
		req, err := decodeGrab(bytes.NewReader(body), false)
		if err == nil && (optErr != nil || opt != req) {
			t.Fatalf("decodeGrab(%q) = %+v without user auth, %+v, %v with it", body, req, opt, optErr)
		}
		if len(body) > MaxGrabBody && !errors.Is(err, errBodyTooLarge) {
			t.Fatalf("decodeGrab(%d bytes) err = %v, want errBodyTooLarge", len(body), err)
		}
		if err != nil {
			return
		}
		if !rain.ValidID(req.PoolID) || !rain.ValidID(req.UserID) {
			t.Fatalf("decodeGrab(%q) accepted invalid ids %+v", body, req)
		}
		again, _ := json.Marshal(req)
		back, err := decodeGrab(bytes.NewReader(again), false)
		if err != nil || back != req {
			t.Fatalf("round trip of %+v: %+v, %v", req, back, err)
		}
		// The hand-written response must be valid JSON with the same ids.
		var out map[string]any
		if err := json.Unmarshal(appendGrab(nil, stGranted, req, grab.Result{Amount: 1, Serial: 2}), &out); err != nil {
			t.Fatalf("appendGrab for %+v is not JSON: %v", req, err)
		}
		if out["pool_id"] != req.PoolID || out["user_id"] != req.UserID {
			t.Fatalf("appendGrab for %+v = %v", req, out)
		}
	})
}

// topKeys lists the keys of body's top-level object as written (an
// independent reading: encoding/json's tokens, no key matching).
func topKeys(body []byte) ([]string, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		k, ok := tok.(string)
		if !ok {
			return nil, false
		}
		keys = append(keys, k)
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return nil, false
		}
	}
	return keys, true
}

// FuzzIsJSONBytes: the listener's Content-Type check, without a string for
// the common value, agrees with isJSON (mime.ParseMediaType) on every
// value.
func FuzzIsJSONBytes(f *testing.F) {
	for _, seed := range []string{
		"application/json", "Application/JSON", "APPLICATION/JSON", "application/json; charset=utf-8",
		"application/j\u017fon", "application/jsoN ", " application/json", "application/json;", "text/plain",
		"application/json-patch+json", "application/jsonx", "applicationxjson", "", "application/\u212ason",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, ct []byte) {
		if got, want := isJSONBytes(ct), isJSON(string(ct)); got != want {
			t.Fatalf("isJSONBytes(%q) = %v, isJSON says %v", ct, got, want)
		}
	})
}

// FuzzPreloadSpec: POST /admin/pools's body as the server reads it (the
// strict decoder, then rain.Spec.Normalize) never panics, and a spec it
// takes is one a split can fill, checked here apart from the code under
// test: a valid id, at least one packet, every packet at least its minimum
// and, with a maximum, at most it, the total within the limit, the
// sub-pools within 0 to the count and the limit, the hold within bounds,
// and a window of at least MinWindow.
func FuzzPreloadSpec(f *testing.F) {
	for _, seed := range []string{
		`{"pool_id":"cny2027","total_cents":500000000,"count":1000000}`,
		`{"pool_id":"p","total_cents":100,"count":10,"min_cents":10,"max_cents":10,"sub_pools":2,"hold_seconds":60}`,
		`{"pool_id":"p","total_cents":100,"count":10,"starts_at":"2027-01-01T00:00:00Z","ends_at":"2027-01-01T00:00:00.5Z"}`,
		`{"pool_id":"p","total_cents":9223372036854775807,"count":9223372036854775807,"min_cents":2}`,
		`{"pool_id":"p","total_cents":-1,"count":-1}`,
		`{"pool_id":"p","total_cents":100,"count":10,"max_cents":9}`,
		`{"pool_id":"p","total_cents":1e3,"count":1}`,
		`{"pool_id":"p","total_cents":100,"count":10,"sub_pools":1025}`,
		`{"pool_id":"p","total_cents":100,"count":10,"starts_at":"1969-12-31T23:59:59Z"}`,
		`{"pool_id":"p","total_cents":100,"count":10,"hold_seconds":-5}`,
		`{"pool_id":"p","total_cents":100,"count":10,"extra":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in rain.Spec
		if decodeStrict(body, &in) != nil {
			return
		}
		s, err := in.Normalize()
		if err != nil {
			if !errors.Is(err, rain.ErrInvalid) {
				t.Fatalf("Normalize(%s) = %v, not an ErrInvalid (a 400)", body, err)
			}
			return
		}
		bad := func(why string) { t.Fatalf("preload %s taken as %+v: %s", body, s, why) }
		switch {
		case !rain.ValidID(s.PoolID):
			bad("a bad pool id")
		case s.Count < 1 || s.MinCents < 1:
			bad("no packet, or a minimum under a cent")
		case s.TotalCents > rain.MaxTotalCents:
			bad("a total over the limit")
		case s.TotalCents/s.Count < s.MinCents:
			bad("the total does not give every packet its minimum")
		case s.MaxCents != 0 && (s.MaxCents < s.MinCents || (s.TotalCents+s.Count-1)/s.Count > s.MaxCents):
			bad("the total does not fit under the maximum")
		case s.SubPools < 0 || s.SubPools > rain.MaxSubPools || int64(s.SubPools) > s.Count:
			bad("sub-pools out of bounds")
		case s.HoldSeconds < 1 || s.HoldSeconds > rain.MaxHoldSeconds:
			bad("a hold out of bounds")
		case s.StartsAt != nil && s.EndsAt != nil && s.EndsAt.Sub(*s.StartsAt) < rain.MinWindow:
			bad("a window too short")
		}
	})
}
