package signature

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzVerify: whatever the signature header, the key and the body, Verify
// never panics, and what it accepts is signed by the secret over that body,
// within the tolerance, with a key that is the body's serial (or none).
func FuzzVerify(f *testing.F) {
	secret := []byte(strings.Repeat("k", 32))
	now := time.Unix(1_800_000_000, 0)
	body := []byte(`{"serial":42,"pool_id":"p","sub_pool":0,"user_id":"u","amount_cents":1,"deadline_ms":0,"granted_at":"0001-01-01T00:00:00Z"}`)
	f.Add(Sign(secret, now, body), "42", body)
	f.Add(Sign(secret, now, body)+",v1=00", "", body)
	f.Add("t=1800000000,t=1,v1=zz", "42", body)
	f.Add("v1=,t=", "x", []byte(`{"serial":42}{}`))
	f.Add(Sign(secret, now, []byte(`{"serial":-1}`)), "-1", []byte(`{"serial":-1}`))
	f.Fuzz(func(t *testing.T, sig, key string, body []byte) {
		h := http.Header{Header: {sig}}
		if key != "" {
			h.Set("Idempotency-Key", key)
		}
		g, err := Verify(h, body, now, 0, secret)
		if err != nil {
			return
		}
		ts, sigs, _ := parse(sig)
		want, _ := hex.DecodeString(strings.TrimPrefix(Sign(secret, time.Unix(ts, 0), body), fmt.Sprintf("t=%d,v1=", ts)))
		if !slices.ContainsFunc(sigs, func(s []byte) bool { return bytes.Equal(s, want) }) {
			t.Fatalf("Verify(%q, %q) accepted a signature that is not the secret's over the body", sig, body)
		}
		if d := now.Sub(time.Unix(ts, 0)); d > DefaultTolerance || d < -DefaultTolerance {
			t.Fatalf("Verify accepted t=%d, %v from now", ts, d)
		}
		if key != "" && key != strconv.FormatInt(g.Serial, 10) || g.Serial <= 0 {
			t.Fatalf("Verify accepted serial %d with key %q", g.Serial, key)
		}
	})
}
