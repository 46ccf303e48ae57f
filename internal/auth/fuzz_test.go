package auth

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"rain"
)

// FuzzSubject: the Authorization header of every grab with user auth on
// is outside input. Whatever it holds, Subject never panics, and it takes
// only a token that is signed with the key and whose sub is a valid user
// id: one it accepts is checked again here by hand (HMAC-SHA256 of its
// first two parts, computed apart from the JWT library), so a token
// accepted without its signature fails the fuzz.
func FuzzSubject(f *testing.F) {
	secret := []byte(strings.Repeat("fuzz-key-", 5))
	dir := f.TempDir()
	path := filepath.Join(dir, "secret")
	if err := os.WriteFile(path, secret, 0o600); err != nil {
		f.Fatal(err)
	}
	users, err := NewUsers(UserConfig{Spec: "hs256:" + path})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(users.Close)
	sign := func(claims jwt.MapClaims, method jwt.SigningMethod, key any) string {
		s, err := jwt.NewWithClaims(method, claims).SignedString(key)
		if err != nil {
			f.Fatal(err)
		}
		return s
	}
	exp := time.Now().Add(time.Hour).Unix()
	good := sign(jwt.MapClaims{"sub": "u_1", "exp": exp}, jwt.SigningMethodHS256, secret)
	for _, seed := range []string{
		"Bearer " + good,
		"bearer   " + good,
		"Bearer " + sign(jwt.MapClaims{"sub": "u 1", "exp": exp}, jwt.SigningMethodHS256, secret),
		"Bearer " + sign(jwt.MapClaims{"sub": "u_1", "exp": time.Now().Add(-time.Hour).Unix()}, jwt.SigningMethodHS256, secret),
		"Bearer " + sign(jwt.MapClaims{"sub": "u_1", "exp": exp}, jwt.SigningMethodHS256, []byte(strings.Repeat("other-key", 5))),
		"Bearer " + sign(jwt.MapClaims{"sub": "u_1", "exp": exp}, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType),
		"Bearer " + good[:len(good)-3],
		"Bearer a.b.c", "Bearer ...", "Basic dTpw", "Bearer", "", "Bearer " + strings.Repeat("e", 5000),
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, authorization string) {
		sub, err := users.Subject(authorization)
		if err != nil {
			return
		}
		if rain.CheckID("sub", sub) != nil {
			t.Fatalf("Subject(%q) took sub %q, not a valid user id", authorization, sub)
		}
		raw, _ := BearerToken(authorization)
		parts := strings.Split(raw, ".")
		if len(parts) != 3 {
			t.Fatalf("Subject(%q) took a token of %d parts", authorization, len(parts))
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(parts[0] + "." + parts[1]))
		sig, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
			t.Fatalf("Subject(%q) = %q: a token whose signature is not the key's HMAC-SHA256 was taken", authorization, sub)
		}
	})
}
