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

// TestKnownAnswer: the wire format wallets in other languages implement,
// pinned by a vector computed outside rain (`printf '%s' "1800000000.$body"
// | openssl dgst -sha256 -hmac 'wallet-secret-0123456789abcdef'`): Sign
// gives exactly it, and Verify takes it and pays the body's serial.
func TestKnownAnswer(t *testing.T) {
	secret := []byte("wallet-secret-0123456789abcdef")
	body := []byte(`{"serial":4711,"pool_id":"cny2027","sub_pool":0,"user_id":"u_123456","amount_cents":888,"deadline_ms":1800000600000,"granted_at":"2027-01-28T12:00:00Z"}`)
	const want = "t=1800000000,v1=dde3bffba6f0a5b449d4025d195f2e3d106202bc7ee639bd377e19ed21bdc95b"
	at := time.Unix(1_800_000_000, 0)
	if got := Sign(secret, at, body); got != want {
		t.Fatalf("Sign = %q, want %q", got, want)
	}
	g, err := Verify(http.Header{Header: {want}, "Idempotency-Key": {"4711"}}, body, at.Add(time.Minute), 0, secret)
	if err != nil || g.Serial != 4711 || g.AmountCents != 888 || g.UserID != "u_123456" {
		t.Fatalf("Verify of the known answer = %+v, %v; want serial 4711, 888 cents, u_123456", g, err)
	}
}
