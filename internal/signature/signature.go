// Package signature signs rain's webhook deliveries (Sign, for
// internal/webhook) and is the wallet's side of one: how a wallet verifies
// a delivery and what it pays on (Verify). It is the reference for wallets
// written in any language (docs/security.md tells it in words), and what a
// wallet in Go may call.
package signature

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"rain/internal/settle"
)

// Errors of Verify: a delivery that fails one is refused, and nothing paid.
var (
	// ErrUnsigned is returned for a delivery without a well-formed
	// Rain-Signature.
	ErrUnsigned = errors.New("signature: none, or malformed")
	// ErrForged is returned when the signature is not the HMAC of the body
	// under any of the wallet's secrets: a forged or changed delivery.
	ErrForged = errors.New("signature: not the body's under any secret")
	// ErrStale is returned when the signature's time is further from the
	// wallet's clock than the tolerance: an old delivery replayed.
	ErrStale = errors.New("signature: too old or too new")
	// ErrKeyMismatch is returned when the Idempotency-Key header is not the
	// serial of the signed body: the key is not signed, and a wallet that
	// paid on it could be made to pay one delivery again under new keys.
	ErrKeyMismatch = errors.New("signature: Idempotency-Key is not the signed serial")
)

// Header carries a webhook delivery's signature.
const Header = "Rain-Signature"

// Sign is the Rain-Signature value of body sent at now:
// "t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>". Each try is
// signed afresh, so its t is the time it was sent. It covers the body (the
// serial the wallet pays on is in it), not the headers.
func Sign(secret []byte, now time.Time, body []byte) string {
	t := strconv.FormatInt(now.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(t))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "t=" + t + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

// DefaultTolerance is how far from the wallet's clock a delivery's
// signature time may be, unless the wallet says otherwise.
const DefaultTolerance = 5 * time.Minute

// Verify checks a webhook delivery as a wallet receives it (its headers and
// its raw body) at now, against each of the wallet's secrets (two while a
// secret is being rotated), and returns the grant to pay.
//
// The signature (Rain-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
// "<t>.<body>">) must be one of the secrets' over this very body, and t
// within tolerance of now (0: DefaultTolerance). The signature covers the
// body, not the headers: the wallet pays each grant once by its Serial, read
// from the signed body, and never by Idempotency-Key, which rain sends equal
// to the serial for wallets that dedupe on it; a delivery whose key differs
// from the body's serial is refused. A serial already paid with the same
// grant (settle.Grant.Same) is answered 2xx again, without paying; one paid
// with another grant is answered 409 Conflict.
func Verify(header http.Header, body []byte, now time.Time, tolerance time.Duration, secrets ...[]byte) (settle.Grant, error) {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	ts, sigs, err := parse(header.Get(Header))
	if err != nil {
		return settle.Grant{}, err
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return settle.Grant{}, fmt.Errorf("%w: t=%d is %v from now", ErrStale, ts, d.Round(time.Second))
	}
	if !signedByOne(ts, body, sigs, secrets) {
		return settle.Grant{}, ErrForged
	}
	// Unknown fields are rain's own (the body is signed): a later rain may
	// add some, and an older wallet still pays.
	var g settle.Grant
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&g); err != nil || dec.More() {
		return settle.Grant{}, fmt.Errorf("signature: the signed body is not one grant: %v", err)
	}
	if g.Serial <= 0 {
		return settle.Grant{}, fmt.Errorf("signature: the signed body has serial %d", g.Serial)
	}
	if key := header.Values("Idempotency-Key"); len(key) > 1 || len(key) == 1 && key[0] != strconv.FormatInt(g.Serial, 10) {
		return settle.Grant{}, fmt.Errorf("%w: key %q, serial %d", ErrKeyMismatch, key, g.Serial)
	}
	return g, nil
}

// parse reads "t=<unix seconds>,v1=<hex>[,v1=<hex>...]"; unknown
// schemes are skipped, so a later one can be added beside v1.
func parse(v string) (ts int64, sigs [][]byte, err error) {
	seenT := false
	for part := range strings.SplitSeq(v, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			if seenT {
				return 0, nil, fmt.Errorf("%w: t twice", ErrUnsigned)
			}
			seenT = true
			if ts, err = strconv.ParseInt(val, 10, 64); err != nil || ts <= 0 {
				return 0, nil, fmt.Errorf("%w: t=%q", ErrUnsigned, val)
			}
		case "v1":
			if sig, err := hex.DecodeString(val); err == nil && len(sig) == sha256.Size {
				sigs = append(sigs, sig)
			}
		}
	}
	if !seenT || len(sigs) == 0 {
		return 0, nil, ErrUnsigned
	}
	return ts, sigs, nil
}

// signedByOne says whether one of sigs is the HMAC of "<ts>.<body>" under
// one of secrets, comparing each in constant time.
func signedByOne(ts int64, body []byte, sigs [][]byte, secrets [][]byte) bool {
	ok := false
	for _, secret := range secrets {
		if len(secret) == 0 {
			continue
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write(strconv.AppendInt(nil, ts, 10))
		mac.Write([]byte{'.'})
		mac.Write(body)
		want := mac.Sum(nil)
		for _, sig := range sigs {
			ok = hmac.Equal(sig, want) || ok
		}
	}
	return ok
}
