package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// jwksOf is a JSON Web Key Set of one P-256 key, padded with pad spaces.
func jwksOf(t *testing.T, pad int) []byte {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"keys": []map[string]string{{"kty": "EC", "crv": "P-256", "kid": "k1",
		"x": base64.RawURLEncoding.EncodeToString(k.X.FillBytes(make([]byte, 32))),
		"y": base64.RawURLEncoding.EncodeToString(k.Y.FillBytes(make([]byte, 32)))}}})
	return append(b[:len(b)-1], append([]byte(strings.Repeat(" ", pad)), '}')...)
}

// TestJWKSURLSafety: a jwks-url must be https: http:// is refused unless
// AllowHTTP says so (tests); a key set that redirects to http is refused,
// so is one that redirects too often, and one larger than maxJWKS; an
// https key set of the right size loads.
func TestJWKSURLSafety(t *testing.T) {
	good := jwksOf(t, 0)
	serve := func(b []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(b) }
	}
	var plainHits atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { plainHits.Add(1); serve(good)(w, r) }))
	defer plain.Close()
	mux := http.NewServeMux()
	mux.Handle("/jwks", serve(good))
	mux.Handle("/big", serve(jwksOf(t, maxJWKS)))
	mux.Handle("/to-http", http.RedirectHandler(plain.URL+"/jwks", http.StatusFound))
	mux.Handle("/moved", http.RedirectHandler("/jwks", http.StatusMovedPermanently))
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()

	load := func(url string, allowHTTP bool) error {
		u, err := NewUsers(UserConfig{Spec: "jwks-url:" + url, Client: tlsSrv.Client(), AllowHTTP: allowHTTP})
		if err == nil {
			u.Close()
		}
		return err
	}
	for _, c := range []struct {
		url       string
		allowHTTP bool
		want      string // in the error; "" loads
	}{
		{plain.URL + "/jwks", false, "https"},
		{plain.URL + "/jwks", true, ""},
		{tlsSrv.URL + "/jwks", false, ""},
		{tlsSrv.URL + "/moved", false, ""},
		{tlsSrv.URL + "/to-http", false, "not https"},
		{tlsSrv.URL + "/loop", false, "redirects more than"},
		{tlsSrv.URL + "/big", false, "larger than"},
	} {
		err := load(c.url, c.allowHTTP)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("jwks-url %s (allow http %v): %v, want loaded", c.url, c.allowHTTP, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("jwks-url %s (allow http %v): %v, want an error saying %q", c.url, c.allowHTTP, err, c.want)
		}
	}
	if n := plainHits.Load(); n != 1 {
		t.Errorf("the http key set was fetched %d times, want once (allowed): never through a redirect", n)
	}
}
