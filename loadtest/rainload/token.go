package main

// This file signs the user tokens of a load against rain serve --user-auth
// hs256:FILE: each grab carries Authorization: Bearer <JWT> whose sub is
// its user id, signed with the same secret, so that the load measures
// rain as it runs behind the app's login.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash"
	"os"
	"strconv"
	"strings"
	"time"
)

// minSecret is rain's shortest HS256 secret (internal/auth.MinSecret).
const minSecret = 32

// jwtHeader is base64url({"alg":"HS256","typ":"JWT"}).
const jwtHeader = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"

// tokenSigner holds what every token of a run shares.
type tokenSigner struct {
	key  []byte
	tail []byte // the claims after sub: `,"exp":N[,"aud":"A"][,"iss":"I"]}`
}

// newTokenSigner reads the secret of file as rain does (its contents less
// surrounding whitespace) and fixes the claims: exp at expires, aud and iss
// when not empty.
func newTokenSigner(file, aud, iss string, expires time.Time) (*tokenSigner, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("-user-secret: %w", err)
	}
	key := []byte(strings.TrimSpace(string(b)))
	if len(key) < minSecret {
		return nil, fmt.Errorf("-user-secret %s: a secret of %d bytes; rain takes %d or more", file, len(key), minSecret)
	}
	tail := []byte(`","exp":` + strconv.FormatInt(expires.Unix(), 10))
	for _, c := range []struct{ name, v string }{{"aud", aud}, {"iss", iss}} {
		if c.v != "" {
			v, _ := json.Marshal(c.v)
			tail = append(tail, `,"`+c.name+`":`...)
			tail = append(tail, v...)
		}
	}
	return &tokenSigner{key: key, tail: append(tail, '}')}, nil
}

// signer is one connection's: its MAC and scratch space are reused.
type signer struct {
	*tokenSigner
	mac     hash.Hash
	payload []byte
}

// forConn returns a connection's signer; nil when t is (no tokens).
func (t *tokenSigner) forConn() *signer {
	if t == nil {
		return nil
	}
	return &signer{tokenSigner: t, mac: hmac.New(sha256.New, t.key)}
}

// appendToken appends the token of user id prefix+n to b. Ids were
// checked to need no JSON escaping.
func (s *signer) appendToken(b []byte, prefix string, n int64) []byte {
	s.payload = append(s.payload[:0], `{"sub":"`...)
	s.payload = append(s.payload, prefix...)
	s.payload = strconv.AppendInt(s.payload, n, 10)
	s.payload = append(s.payload, s.tail...)
	start := len(b)
	b = append(b, jwtHeader...)
	b = append(b, '.')
	b = base64.RawURLEncoding.AppendEncode(b, s.payload)
	s.mac.Reset()
	s.mac.Write(b[start:])
	var sum [sha256.Size]byte
	b = append(b, '.')
	return base64.RawURLEncoding.AppendEncode(b, s.mac.Sum(sum[:0]))
}
