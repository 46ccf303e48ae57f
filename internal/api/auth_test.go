package api

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"rain/internal/auth"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// grabAs posts a grab with the given Authorization header.
func (s *stack) grabAs(t *testing.T, authorization, body string) response {
	t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/grab", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := response{Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After"), Body: map[string]any{}}
	_ = json.NewDecoder(resp.Body).Decode(&out.Body)
	out.Body["www-authenticate"] = resp.Header.Get("WWW-Authenticate")
	return out
}

func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return "Bearer " + s
}

func writeFile(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUserAuth: with user auth on, a grab needs a valid token of the app's
// login service, whatever the key kind: no token, a bad signature, an
// expired token, a token without exp, a wrong audience or issuer, another user's
// token than the body's, the none algorithm → 401 (WWW-Authenticate) and
// the pool unchanged; a valid token grabs for its sub, with user_id in the
// body or without it.
// jwkEC is the JWK of a P-256 public key.
func jwkEC(kid string, k *ecdsa.PublicKey) map[string]string {
	b, _ := k.Bytes() // 0x04 || X || Y
	return map[string]string{"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "alg": "ES256",
		"x": base64.RawURLEncoding.EncodeToString(b[1:33]), "y": base64.RawURLEncoding.EncodeToString(b[33:])}
}

func TestUserAuth(t *testing.T) {
	secret := []byte(strings.Repeat("s3cret-", 6))
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	rsaPEM, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	edPEM, _ := x509.MarshalPKIXPublicKey(edPub)
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "use": "sig", "n": base64.RawURLEncoding.EncodeToString(rsaKey.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(rsaKey.E)).Bytes())},
		{"kty": "OKP", "crv": "Ed25519", "kid": "e1", "x": base64.RawURLEncoding.EncodeToString(edPub)},
	}})
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherEC, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPEM, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	ecJWKS, _ := json.Marshal(map[string]any{"keys": []map[string]string{jwkEC("p1", &ecKey.PublicKey)}})

	for _, c := range []struct {
		name   string
		spec   string
		method jwt.SigningMethod
		key    any
		kid    string
		wrong  any // a key of the same kind the server does not trust
	}{
		{"hs256", "hs256:" + writeFile(t, "secret", append(secret, '\n')), jwt.SigningMethodHS256, secret, "", []byte(strings.Repeat("other-", 8))},
		{"rs256", "rs256:" + writeFile(t, "rsa.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaPEM})), jwt.SigningMethodRS256, rsaKey, "", otherRSA},
		{"eddsa", "eddsa:" + writeFile(t, "ed.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: edPEM})), jwt.SigningMethodEdDSA, edPriv, "", ed25519.NewKeyFromSeed(make([]byte, 32))},
		{"jwks-rsa", "jwks:" + writeFile(t, "jwks.json", jwks), jwt.SigningMethodRS256, rsaKey, "r1", otherRSA},
		{"jwks-ed", "jwks:" + writeFile(t, "jwks.json", jwks), jwt.SigningMethodEdDSA, edPriv, "e1", ed25519.NewKeyFromSeed(make([]byte, 32))},
		{"es256", "es256:" + writeFile(t, "ec.pem", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPEM})), jwt.SigningMethodES256, ecKey, "", otherEC},
		{"jwks-es256", "jwks:" + writeFile(t, "ec-jwks.json", ecJWKS), jwt.SigningMethodES256, ecKey, "p1", otherEC},
	} {
		t.Run(c.name, func(t *testing.T) {
			users, err := auth.NewUsers(auth.UserConfig{Spec: c.spec, Audience: "rain", Issuer: "login", Leeway: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			s := newStack(t, 1, redistest.Options{}, func(cfg *Config) { cfg.Users = users })
			s.preload(t, `{"pool_id":"p","total_cents":1000,"count":10}`)
			now := time.Now()
			claims := func(sub string, exp time.Time) jwt.MapClaims {
				return jwt.MapClaims{"sub": sub, "exp": exp.Unix(), "aud": "rain", "iss": "login", "iat": now.Unix()}
			}
			good := sign(t, c.method, c.key, c.kid, claims("alice", now.Add(time.Minute)))
			noExp := jwt.MapClaims{"sub": "alice", "aud": "rain"}
			noneTok, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims("alice", now.Add(time.Minute))).SignedString(jwt.UnsafeAllowNoneSignatureType)
			for _, bad := range []struct{ what, authz, body string }{
				{"no token", "", `{"pool_id":"p","user_id":"alice"}`},
				{"not a bearer", "Basic YWxpY2U6eA==", `{"pool_id":"p","user_id":"alice"}`},
				{"garbage", "Bearer not.a.jwt", `{"pool_id":"p"}`},
				{"bad signature", sign(t, c.method, c.wrong, c.kid, claims("alice", now.Add(time.Minute))), `{"pool_id":"p"}`},
				{"expired", sign(t, c.method, c.key, c.kid, claims("alice", now.Add(-time.Minute))), `{"pool_id":"p"}`},
				{"no exp", sign(t, c.method, c.key, c.kid, noExp), `{"pool_id":"p"}`},
				{"wrong audience", sign(t, c.method, c.key, c.kid, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Minute).Unix(), "aud": "other", "iss": "login"}), `{"pool_id":"p"}`},
				{"wrong issuer", sign(t, c.method, c.key, c.kid, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Minute).Unix(), "aud": "rain", "iss": "elsewhere"}), `{"pool_id":"p"}`},
				{"no issuer", sign(t, c.method, c.key, c.kid, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Minute).Unix(), "aud": "rain"}), `{"pool_id":"p"}`},
				{"alg none", "Bearer " + noneTok, `{"pool_id":"p"}`},
				{"bad sub", sign(t, c.method, c.key, c.kid, claims("al ice", now.Add(time.Minute))), `{"pool_id":"p"}`},
				{"another user's token", good, `{"pool_id":"p","user_id":"mallory"}`},
			} {
				r := s.grabAs(t, bad.authz, bad.body)
				if r.Code != 401 || r.Body["status"] != "unauthorized" || r.Body["error"] == "" ||
					!strings.HasPrefix(r.Body["www-authenticate"].(string), "Bearer") {
					t.Errorf("%s: %d %v, want 401 unauthorized with a reason and WWW-Authenticate", bad.what, r.Code, r.Body)
				}
			}
			if st := s.do(t, "GET", "/admin/pools/p", token, ""); st.Body["remaining_count"] != float64(10) {
				t.Fatalf("pool after refused grabs = %v, want all 10 packets", st.Body)
			}
			// A valid token grabs for its sub, user_id omitted or the same.
			r := s.grabAs(t, good, `{"pool_id":"p"}`)
			if r.Code != 200 || r.Body["status"] != "granted" || r.Body["user_id"] != "alice" {
				t.Fatalf("valid token = %d %v, want granted to alice", r.Code, r.Body)
			}
			r = s.grabAs(t, good, `{"pool_id":"p","user_id":"alice"}`)
			if r.Code != 200 || r.Body["status"] != "already_granted" {
				t.Fatalf("valid token again = %d %v, want already_granted", r.Code, r.Body)
			}
			// The scheme's name is case-insensitive (RFC 9110 section 11.1).
			lower := "bearer  " + strings.TrimPrefix(good, "Bearer ")
			if r := s.grabAs(t, lower, `{"pool_id":"p"}`); r.Code != 200 || r.Body["status"] != "already_granted" {
				t.Fatalf("%q = %d %v, want already_granted", "bearer  <token>", r.Code, r.Body)
			}
			// A clock a second behind the issuer is within the leeway.
			if r := s.grabAs(t, sign(t, c.method, c.key, c.kid, claims("bob", time.Now().Add(-time.Second))), `{"pool_id":"p"}`); r.Code != 200 {
				t.Fatalf("token expired 1 s ago with 10 s leeway = %d %v, want 200", r.Code, r.Body)
			}
		})
	}
}

// TestUserAuthReload: a new key file takes effect at Reload (SIGHUP in rain
// serve); a reload that fails keeps the old key.
func TestUserAuthReload(t *testing.T) {
	oldKey, newKey := []byte(strings.Repeat("a", 40)), []byte(strings.Repeat("b", 40))
	path := writeFile(t, "secret", oldKey)
	users, err := auth.NewUsers(auth.UserConfig{Spec: "hs256:" + path})
	if err != nil {
		t.Fatal(err)
	}
	tok := func(key []byte) string {
		return sign(t, jwt.SigningMethodHS256, key, "", jwt.MapClaims{"sub": "u", "exp": time.Now().Add(time.Minute).Unix()})
	}
	if _, err := users.Subject(tok(oldKey)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("short"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := users.Reload(); err == nil {
		t.Fatal("reload of a 5-byte secret succeeded, want refused")
	}
	if _, err := users.Subject(tok(oldKey)); err != nil {
		t.Fatalf("after a failed reload the old key = %v, want kept", err)
	}
	if err := os.WriteFile(path, newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := users.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := users.Subject(tok(oldKey)); err == nil {
		t.Fatal("the old key still verifies after the reload")
	}
	if sub, err := users.Subject(tok(newKey)); err != nil || sub != "u" {
		t.Fatalf("the new key = %q, %v", sub, err)
	}
}

// countingRunner counts the places a Runner gave.
type countingRunner struct {
	Runner
	admitted atomic.Int64
}

func (r *countingRunner) Admit() bool {
	r.admitted.Add(1)
	return r.Runner.Admit()
}

// TestUnauthorizedBeforeAdmission: with user auth on, a grab without a
// bearer token is refused 401 at once, before its body is read; one with a
// bad token whose body never comes waits for it no longer than the body
// timeout and is refused then; neither takes a place in the worker pool
// (a token is verified once the grab has its place, so a shed grab costs
// no verification).
func TestUnauthorizedBeforeAdmission(t *testing.T) {
	users, err := auth.NewUsers(auth.UserConfig{Spec: "hs256:" + writeFile(t, "secret", []byte(strings.Repeat("k", 40)))})
	if err != nil {
		t.Fatal(err)
	}
	var runner *countingRunner
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) {
		cfg.Users = users
		cfg.GrabBodyTimeout = 500 * time.Millisecond
		runner = &countingRunner{Runner: cfg.Runner}
		cfg.Runner = runner
	})
	if r := s.grabAs(t, "", `{"pool_id":"p","user_id":"u"}`); r.Code != 401 {
		t.Fatalf("no token = %d %v, want 401", r.Code, r.Body)
	}
	for _, c := range []struct {
		authz string
		code  int
	}{{"Authorization: Bearer not.a.jwt", 400}, {"Authorization: Basic dTpw", 401}, {"", 401}} {
		if code := s.withheldBody(t, c.authz); code != c.code {
			t.Fatalf("%q with a body that never comes = %d, want %d", c.authz, code, c.code)
		}
	}
	if n := runner.admitted.Load(); n != 0 {
		t.Fatalf("grabs without a valid token and body took %d places in the worker pool, want none", n)
	}
	if r := s.grabAs(t, "Bearer not.a.jwt", `{"pool_id":"p","user_id":"u"}`); r.Code != 401 {
		t.Fatalf("a bad token with its body = %d %v, want 401", r.Code, r.Body)
	}
}

// withheldBody sends a grab's headers (and header, when not empty) and
// one byte of its body, never the rest, and returns the status of the
// answer, which must come within 5 s.
func (s *stack) withheldBody(t *testing.T, header string) int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /grab HTTP/1.1\r\nHost: rain\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
	if header != "" {
		req += header + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n{")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%q with a body that never comes: %v, want an answer at once", header, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// jwksServer serves a JSON Web Key Set that a test can change, counting the
// fetches.
type jwksServer struct {
	mu      sync.Mutex
	keys    []map[string]string
	fetches int
}

func (j *jwksServer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.fetches++
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"keys": j.keys})
}

func (j *jwksServer) set(keys ...map[string]string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.keys = keys
}

// TestUserAuthJWKSURL: --user-auth jwks-url:URL fetches the login
// service's key set at start (an endpoint that does not answer fails the
// start); a token signed with a key the set gained since (a rotation) is
// verified at once, the set fetched again for its unknown kid; a key
// dropped from the set stops verifying at the next refresh; a flood of
// unknown kids costs the endpoint one fetch per interval, not one each.
func TestUserAuthJWKSURL(t *testing.T) {
	k1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	k2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	j := &jwksServer{}
	j.set(jwkEC("k1", &k1.PublicKey))
	srv := httptest.NewTLSServer(j)
	defer srv.Close()
	if _, err := auth.NewUsers(auth.UserConfig{Spec: "jwks-url:https://127.0.0.1:1/jwks"}); err == nil {
		t.Fatal("jwks-url that does not answer: NewUsers succeeded, want the start refused")
	}
	users, err := auth.NewUsers(auth.UserConfig{Spec: "jwks-url:" + srv.URL, Refresh: 200 * time.Millisecond, Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer users.Close()
	tok := func(key *ecdsa.PrivateKey, kid, sub string) string {
		return sign(t, jwt.SigningMethodES256, key, kid, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Minute).Unix()})
	}
	if sub, err := users.Subject(tok(k1, "k1", "alice")); err != nil || sub != "alice" {
		t.Fatalf("a token of the fetched key = %q, %v", sub, err)
	}
	j.set(jwkEC("k1", &k1.PublicKey), jwkEC("k2", &k2.PublicKey)) // the login service rotates
	if sub, err := users.Subject(tok(k2, "k2", "bob")); err != nil || sub != "bob" {
		t.Fatalf("a token of the rotated-in key = %q, %v; want verified at once", sub, err)
	}
	j.set(jwkEC("k2", &k2.PublicKey)) // k1 retired
	waittest.Until(t, 10*time.Second, "a token of the retired key refused after a refresh", func() bool {
		_, err := users.Subject(tok(k1, "k1", "alice"))
		return err != nil
	})
	j.mu.Lock()
	before := j.fetches
	j.mu.Unlock()
	for i := range 50 {
		if _, err := users.Subject(tok(k2, fmt.Sprintf("forged-%d", i), "mallory")); err == nil {
			t.Fatal("a token naming an unknown kid was verified")
		}
	}
	j.mu.Lock()
	after := j.fetches
	j.mu.Unlock()
	if after-before > 5 {
		t.Fatalf("50 tokens of unknown kids made %d fetches of the key set, want a few at most", after-before)
	}
	if sub, err := users.Subject(tok(k2, "k2", "bob")); err != nil || sub != "bob" {
		t.Fatalf("the current key after the flood = %q, %v", sub, err)
	}
}
