package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBearerToken(t *testing.T) {
	for _, c := range []struct {
		header, token string
		ok            bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer abc", "abc", true},
		{"BEARER abc", "abc", true},
		{"Bearer   abc", "abc", true},
		{"Bearer ", "", false},
		{"Bearer", "", false},
		{"", "", false},
		{"Basic abc", "", false},
		{"Bearerabc", "", false},
		{"Bearer\tabc", "", false},
	} {
		token, ok := BearerToken(c.header)
		if token != c.token || ok != c.ok {
			t.Errorf("BearerToken(%q) = %q, %v; want %q, %v", c.header, token, ok, c.token, c.ok)
		}
	}
}

func writeKey(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func jwksRSA(kid string, k *rsa.PublicKey) map[string]string {
	return map[string]string{"kty": "RSA", "kid": kid, "n": base64.RawURLEncoding.EncodeToString(k.N.Bytes()),
		"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(k.E)).Bytes())}
}

// TestKeysRefusedAtLoad: keys that cannot be trusted are refused when
// loaded (at start and on reload), with a reason, never at the first grab:
// an RSA key under 2,048 bits, an even RSA exponent, a JWKS with one kid
// twice.
func TestKeysRefusedAtLoad(t *testing.T) {
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	good, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ed := map[string]string{"kty": "OKP", "crv": "Ed25519", "kid": "a", "x": base64.RawURLEncoding.EncodeToString(edPub)}
	even := &rsa.PublicKey{N: good.N, E: 65536}
	smallPEM, _ := x509.MarshalPKIXPublicKey(&small.PublicKey)
	goodPEM, _ := x509.MarshalPKIXPublicKey(&good.PublicKey)
	set := func(keys ...map[string]string) []byte {
		b, _ := json.Marshal(map[string]any{"keys": keys})
		return b
	}
	for _, c := range []struct {
		name, kind string
		file       []byte
		want       string // in the error; empty: loads
	}{
		{"rsa pem 2048", "rs256", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: goodPEM}), ""},
		{"rsa pem 1024", "rs256", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: smallPEM}), "1024 bits"},
		{"jwks ok", "jwks", set(jwksRSA("r", &good.PublicKey), ed), ""},
		{"jwks rsa 1024", "jwks", set(jwksRSA("r", &small.PublicKey)), "1024 bits"},
		{"jwks even exponent", "jwks", set(jwksRSA("r", even)), "exponent"},
		{"jwks kid twice", "jwks", set(jwksRSA("a", &good.PublicKey), ed), "twice"},
	} {
		_, err := NewUsers(UserConfig{Spec: c.kind + ":" + writeKey(t, c.file)})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want loaded", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
