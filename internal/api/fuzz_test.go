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
