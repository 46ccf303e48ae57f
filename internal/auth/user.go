// Package auth checks who is asking: the signed user identity on POST
// /grab (a JWT from the app's login service) and the operator's admin
// tokens. Both reload their keys from files (rain serve does on SIGHUP);
// a reload that fails keeps the keys in use.
package auth

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"rain"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// UserConfig configures user identity.
type UserConfig struct {
	// Spec says how tokens are signed and where the key is:
	// "hs256:FILE" (a shared secret, the file's contents less surrounding
	// whitespace, at least 32 bytes), "rs256:FILE", "es256:FILE" (P-256) or
	// "eddsa:FILE" (a PEM public key or certificate), "jwks:FILE" (a JSON
	// Web Key Set of RSA, P-256 and Ed25519 keys, chosen by the token's kid),
	// or "jwks-url:URL" (the login service's JWKS endpoint, fetched at start,
	// refreshed every Refresh and at once, at most every unknownKIDEvery,
	// when a token names a kid it does not have: a key rotation).
	Spec string
	// Audience, when set, must be in the token's aud.
	Audience string
	// Issuer, when set, must be the token's iss.
	Issuer string
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway time.Duration
	// Refresh is how often a jwks-url is fetched again. Default 5m.
	Refresh time.Duration
	// Client fetches a jwks-url. Default: a client with a 5s timeout.
	// Whichever it is, its redirects are refused unless to https (and at
	// most maxJWKSRedirects), and an answer over maxJWKS bytes fails the
	// fetch.
	Client *http.Client
	// AllowHTTP lets a jwks-url be http:// (and redirect to http://): for
	// tests. Anyone on the path of a plain fetch serves their own key and
	// signs tokens for any user.
	AllowHTTP bool
}

// Errors of Subject; every one is answered 401.
var (
	ErrNoToken      = errors.New("missing bearer token (Authorization: Bearer <JWT>)")
	ErrInvalidToken = errors.New("invalid user token")
)

// MinSecret is the shortest HS256 secret accepted, in bytes.
const MinSecret = 32

// MinRSABits is the smallest RSA modulus accepted, in bits.
const MinRSABits = 2048

// unknownKIDEvery bounds the fetches of a jwks-url that tokens naming a kid
// it lacks can cause (a flood of forged kids costs the login service one
// fetch each so often); a token waits for one at most jwksFetchTimeout.
const (
	unknownKIDEvery  = 10 * time.Second
	jwksFetchTimeout = 5 * time.Second
)

// Users verifies user tokens. It is safe for concurrent use. Close it to
// stop a jwks-url's refreshes.
type Users struct {
	cfg     UserConfig
	kind    string // hs256, rs256, es256, eddsa, jwks, jwks-url
	file    string // or the URL, for jwks-url
	keys    atomic.Pointer[keySet]
	parser  *jwt.Parser
	methods []string
	stop    context.CancelFunc // ends a jwks-url's refreshes; nil otherwise
}

type keySet struct {
	single any             // hs256 ([]byte), rs256 (*rsa.PublicKey), es256 (*ecdsa.PublicKey), eddsa (ed25519.PublicKey)
	set    keyfunc.Keyfunc // jwks, jwks-url: the key by the token's kid
}

// NewUsers loads the key of cfg.Spec.
func NewUsers(cfg UserConfig) (*Users, error) {
	kind, file, ok := strings.Cut(cfg.Spec, ":")
	if !ok || file == "" {
		return nil, fmt.Errorf("user auth %q: want hs256:FILE, rs256:FILE, es256:FILE, eddsa:FILE, jwks:FILE or jwks-url:URL", cfg.Spec)
	}
	u := &Users{cfg: cfg, kind: strings.ToLower(kind), file: file}
	switch u.kind {
	case "hs256":
		u.methods = []string{"HS256"}
	case "rs256":
		u.methods = []string{"RS256"}
	case "es256":
		u.methods = []string{"ES256"}
	case "eddsa":
		u.methods = []string{"EdDSA"}
	case "jwks", "jwks-url":
		u.methods = []string{"RS256", "ES256", "EdDSA"}
	default:
		return nil, fmt.Errorf("user auth %q: unknown kind %q (want hs256, rs256, es256, eddsa, jwks or jwks-url)", cfg.Spec, kind)
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(u.methods), jwt.WithExpirationRequired(), jwt.WithLeeway(cfg.Leeway)}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	u.parser = jwt.NewParser(opts...)
	if u.kind == "jwks-url" {
		if err := u.fetchJWKS(); err != nil {
			return nil, err
		}
		return u, nil
	}
	if err := u.Reload(); err != nil {
		return nil, err
	}
	return u, nil
}

// fetchJWKS starts the key set of a jwks-url: fetched now (an endpoint
// that does not answer fails the start), then refreshed in the background.
func (u *Users) fetchJWKS() error {
	p, err := url.Parse(u.file)
	switch {
	case err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "":
		return fmt.Errorf("user auth %q: want jwks-url:https://HOST/PATH", u.cfg.Spec)
	case p.Scheme == "http" && !u.cfg.AllowHTTP:
		return fmt.Errorf("user auth %q: an http:// key set lets anyone on the path serve their own key and sign tokens for any user: want jwks-url:https://HOST/PATH", u.cfg.Spec)
	}
	refresh := u.cfg.Refresh
	if refresh <= 0 {
		refresh = 5 * time.Minute
	}
	client := jwksClient(u.cfg.Client, u.cfg.AllowHTTP)
	ctx, cancel := context.WithCancel(context.Background())
	fail := false
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{u.file}, keyfunc.Override{
		Client: client, HTTPTimeout: jwksFetchTimeout, RefreshInterval: refresh,
		// A token for an unknown kid refreshes at once when the limiter has a
		// fetch to give, else fails at once (the limiter says its next fetch
		// is further than the wait allowed): the bound is never waited out.
		RefreshUnknownKID: rate.NewLimiter(rate.Every(unknownKIDEvery), 1), RateLimitWaitMax: time.Second,
		NoErrorReturnFirstHTTPReq: &fail,
		RefreshErrorHandlerFunc: func(string) func(context.Context, error) {
			return func(context.Context, error) {} // the keys in use stay; a token they cannot verify says so
		},
	})
	if err != nil {
		cancel()
		return fmt.Errorf("user auth %s: %w", u.file, err)
	}
	if err := checkKeys(ctx, kf); err != nil {
		cancel()
		return fmt.Errorf("user auth %s: %w", u.file, err)
	}
	u.stop = cancel
	u.keys.Store(&keySet{set: kf})
	return nil
}

// Close stops a jwks-url's refreshes; it does nothing for a key file.
func (u *Users) Close() {
	if u.stop != nil {
		u.stop()
	}
}

// Reload reads the key file again; on error the keys in use stay. A
// jwks-url refreshes itself: Reload does nothing for it.
func (u *Users) Reload() error {
	if u.kind == "jwks-url" {
		return nil
	}
	b, err := ReadKeyFile(u.file)
	if err != nil {
		return fmt.Errorf("user auth key: %w", err)
	}
	ks := &keySet{}
	switch u.kind {
	case "hs256":
		secret := []byte(strings.TrimSpace(string(b)))
		if len(secret) < MinSecret {
			return fmt.Errorf("user auth key %s: an HS256 secret of %d bytes; want at least %d", u.file, len(secret), MinSecret)
		}
		ks.single = secret
	case "rs256", "es256", "eddsa":
		key, err := parsePEMPublicKey(b)
		if err == nil {
			err = keyFor(u.kind, key)
		}
		if err != nil {
			return fmt.Errorf("user auth key %s: %w", u.file, err)
		}
		ks.single = key
	case "jwks":
		if ks.set, err = parseJWKS(b); err != nil {
			return fmt.Errorf("user auth key %s: %w", u.file, err)
		}
	}
	u.keys.Store(ks)
	return nil
}

// keyFor checks that key is one of kind, and fit to trust.
func keyFor(kind string, key any) error {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if kind != "rs256" {
			return fmt.Errorf("an RSA key for %s", kind)
		}
		return checkRSA(k)
	case *ecdsa.PublicKey:
		if kind != "es256" {
			return fmt.Errorf("an ECDSA key for %s", kind)
		}
		return checkEC(k)
	case ed25519.PublicKey:
		if kind != "eddsa" {
			return fmt.Errorf("an Ed25519 key for %s", kind)
		}
		return nil
	}
	return fmt.Errorf("a %T; want RSA, ECDSA P-256 or Ed25519", key)
}

// Subject checks the Authorization header's bearer token and returns its
// subject, the user id. Errors wrap ErrNoToken or ErrInvalidToken, with a
// reason fit to answer.
func (u *Users) Subject(authorization string) (string, error) {
	raw, ok := BearerToken(authorization)
	if !ok {
		return "", ErrNoToken
	}
	ks := u.keys.Load()
	var claims jwt.RegisteredClaims
	_, err := u.parser.ParseWithClaims(raw, &claims, func(t *jwt.Token) (any, error) {
		if ks.set == nil {
			return ks.single, nil
		}
		kid, _ := t.Header["kid"].(string)
		if kid == "" {
			return nil, errors.New("no kid: a key set needs the token to name its key")
		}
		key, err := ks.set.Keyfunc(t)
		if err != nil {
			return nil, fmt.Errorf("no key with kid %q", kid)
		}
		if err := keyForAlg(t.Method.Alg(), key); err != nil {
			return nil, fmt.Errorf("key %q: %w", kid, err)
		}
		return key, nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if err := rain.CheckID("the token's sub", claims.Subject); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	return claims.Subject, nil
}

// BearerToken returns the token of an Authorization header value of the
// Bearer scheme. The scheme's name is case-insensitive and may be followed
// by several spaces (RFC 9110 section 11.1, RFC 6750 section 2.1); ok is
// false for another scheme or an empty token.
func BearerToken(authorization string) (token string, ok bool) {
	scheme, rest, found := strings.Cut(authorization, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(rest, " ")
	return token, token != ""
}

// parsePEMPublicKey reads a PEM public key (PKIX or PKCS #1) or certificate.
func parsePEMPublicKey(b []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		return x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return cert.PublicKey, nil
	}
	return nil, fmt.Errorf("PEM block %q; want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", block.Type)
}

// checkRSA refuses an RSA public key too small to trust or malformed:
// a modulus under MinRSABits, an even or too small exponent.
func checkRSA(k *rsa.PublicKey) error {
	if k.N.BitLen() < MinRSABits {
		return fmt.Errorf("an RSA key of %d bits; want at least %d", k.N.BitLen(), MinRSABits)
	}
	if k.E < 3 || k.E%2 == 0 {
		return fmt.Errorf("an RSA exponent of %d; want an odd number of at least 3", k.E)
	}
	return nil
}

// checkEC refuses an ECDSA key that is not on P-256 (ES256's curve).
func checkEC(k *ecdsa.PublicKey) error {
	if k.Curve != elliptic.P256() {
		return fmt.Errorf("an ECDSA key on %s; want P-256", k.Curve.Params().Name)
	}
	return nil
}

// keyForAlg checks that a key of a set fits the token's alg.
func keyForAlg(alg string, key any) error {
	kind := map[string]string{"RS256": "rs256", "ES256": "es256", "EdDSA": "eddsa"}[alg]
	if kind == "" {
		return fmt.Errorf("alg %q", alg)
	}
	return keyFor(kind, key)
}

// parseJWKS reads a JSON Web Key Set (github.com/MicahParks/jwkset) and
// checks it: its signing keys are RSA (2048 bits or more), P-256 or
// Ed25519, each kid names one key, and there is at least one.
func parseJWKS(b []byte) (keyfunc.Keyfunc, error) {
	var raw struct {
		Keys []struct {
			Kid string `json:"kid"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	seen := map[string]bool{}
	for i, k := range raw.Keys {
		if seen[k.Kid] {
			return nil, fmt.Errorf("JWKS key %d: kid %q appears twice (a token could not say which key signed it)", i, k.Kid)
		}
		seen[k.Kid] = true
	}
	kf, err := keyfunc.NewJWKSetJSON(b)
	if err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	if err := checkKeys(context.Background(), kf); err != nil {
		return nil, err
	}
	return kf, nil
}

// checkKeys checks every signing key of a set (see parseJWKS).
func checkKeys(ctx context.Context, kf keyfunc.Keyfunc) error {
	all, err := kf.Storage().KeyReadAll(ctx)
	if err != nil {
		return fmt.Errorf("JWKS: %w", err)
	}
	n := 0
	for _, jwk := range all {
		m := jwk.Marshal()
		if m.USE != "" && m.USE != jwkset.UseSig {
			continue
		}
		key := jwk.Key()
		if pk, ok := key.(interface{ Public() crypto.PublicKey }); ok {
			key = pk.Public()
		}
		var kind string
		switch key.(type) {
		case *rsa.PublicKey:
			kind = "rs256"
		case *ecdsa.PublicKey:
			kind = "es256"
		case ed25519.PublicKey:
			kind = "eddsa"
		default:
			continue // not a key rain verifies with
		}
		if err := keyFor(kind, key); err != nil {
			return fmt.Errorf("JWKS key %q: %w", m.KID, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("JWKS: no RSA, P-256 or Ed25519 signing key")
	}
	return nil
}
