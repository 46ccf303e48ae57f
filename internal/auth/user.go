// Package auth checks who is asking: the signed user identity on POST
// /grab (a JWT from the app's login service) and the operator's admin
// tokens. Both reload their keys from files (rain serve does on SIGHUP);
// a reload that fails keeps the keys in use.
package auth

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"rain/internal/catalog"

	"github.com/golang-jwt/jwt/v5"
)

// UserConfig configures user identity.
type UserConfig struct {
	// Spec says how tokens are signed and where the key is:
	// "hs256:FILE" (a shared secret, the file's contents less surrounding
	// whitespace, at least 32 bytes), "rs256:FILE" or "eddsa:FILE" (a PEM
	// public key or certificate), "jwks:FILE" (a JSON Web Key Set of RSA and
	// Ed25519 keys, chosen by the token's kid).
	Spec string
	// Audience, when set, must be in the token's aud.
	Audience string
	// Issuer, when set, must be the token's iss.
	Issuer string
	// Leeway is the clock skew allowed on exp and nbf.
	Leeway time.Duration
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

// Users verifies user tokens. It is safe for concurrent use.
type Users struct {
	cfg     UserConfig
	kind    string // hs256, rs256, eddsa, jwks
	file    string
	keys    atomic.Pointer[keySet]
	parser  *jwt.Parser
	methods []string
}

type keySet struct {
	single any            // hs256 ([]byte), rs256 (*rsa.PublicKey), eddsa (ed25519.PublicKey)
	byKID  map[string]any // jwks
}

// NewUsers loads the key of cfg.Spec.
func NewUsers(cfg UserConfig) (*Users, error) {
	kind, file, ok := strings.Cut(cfg.Spec, ":")
	if !ok || file == "" {
		return nil, fmt.Errorf("user auth %q: want hs256:FILE, rs256:FILE, eddsa:FILE or jwks:FILE", cfg.Spec)
	}
	u := &Users{cfg: cfg, kind: strings.ToLower(kind), file: file}
	switch u.kind {
	case "hs256":
		u.methods = []string{"HS256"}
	case "rs256":
		u.methods = []string{"RS256"}
	case "eddsa":
		u.methods = []string{"EdDSA"}
	case "jwks":
		u.methods = []string{"RS256", "EdDSA"}
	default:
		return nil, fmt.Errorf("user auth %q: unknown kind %q (want hs256, rs256, eddsa or jwks)", cfg.Spec, kind)
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(u.methods), jwt.WithExpirationRequired(), jwt.WithLeeway(cfg.Leeway)}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	u.parser = jwt.NewParser(opts...)
	if err := u.Reload(); err != nil {
		return nil, err
	}
	return u, nil
}

// Reload reads the key file again; on error the keys in use stay.
func (u *Users) Reload() error {
	b, err := os.ReadFile(u.file)
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
	case "rs256", "eddsa":
		key, err := parsePEMPublicKey(b)
		if err != nil {
			return fmt.Errorf("user auth key %s: %w", u.file, err)
		}
		switch k := key.(type) {
		case *rsa.PublicKey:
			if u.kind != "rs256" {
				return fmt.Errorf("user auth key %s: an RSA key for %s", u.file, u.kind)
			}
			if err := checkRSA(k); err != nil {
				return fmt.Errorf("user auth key %s: %w", u.file, err)
			}
		case ed25519.PublicKey:
			if u.kind != "eddsa" {
				return fmt.Errorf("user auth key %s: an Ed25519 key for %s", u.file, u.kind)
			}
		default:
			return fmt.Errorf("user auth key %s: a %T; want RSA or Ed25519", u.file, key)
		}
		ks.single = key
	case "jwks":
		if ks.byKID, err = parseJWKS(b); err != nil {
			return fmt.Errorf("user auth key %s: %w", u.file, err)
		}
	}
	u.keys.Store(ks)
	return nil
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
		if ks.byKID == nil {
			return ks.single, nil
		}
		kid, _ := t.Header["kid"].(string)
		if key, ok := ks.byKID[kid]; ok {
			return key, nil
		}
		return nil, fmt.Errorf("no key with kid %q", kid)
	})
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidToken, err)
	}
	if err := catalog.CheckID("the token's sub", claims.Subject); err != nil {
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

// parseJWKS reads the RSA and Ed25519 (OKP) keys of a JSON Web Key Set, by
// kid; other kinds of key are skipped.
func parseJWKS(b []byte) (map[string]any, error) {
	var set struct {
		Keys []struct {
			Kty string `json:"kty"`
			Kid string `json:"kid"`
			Use string `json:"use"`
			Crv string `json:"crv"`
			N   string `json:"n"`
			E   string `json:"e"`
			X   string `json:"x"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	out := map[string]any{}
	add := func(i int, kid string, key any) error {
		if _, dup := out[kid]; dup {
			return fmt.Errorf("JWKS key %d: kid %q appears twice (a token could not say which key signed it)", i, kid)
		}
		out[kid] = key
		return nil
	}
	dec := base64.RawURLEncoding
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		switch {
		case k.Kty == "RSA":
			n, err1 := dec.DecodeString(k.N)
			e, err2 := dec.DecodeString(k.E)
			if err := errors.Join(err1, err2); err != nil || len(e) == 0 || len(e) > 4 {
				return nil, fmt.Errorf("JWKS key %d (%q): bad n or e", i, k.Kid)
			}
			key := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
			if err := checkRSA(key); err != nil {
				return nil, fmt.Errorf("JWKS key %d (%q): %w", i, k.Kid, err)
			}
			if err := add(i, k.Kid, key); err != nil {
				return nil, err
			}
		case k.Kty == "OKP" && k.Crv == "Ed25519":
			x, err := dec.DecodeString(k.X)
			if err != nil || len(x) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("JWKS key %d (%q): bad x", i, k.Kid)
			}
			if err := add(i, k.Kid, ed25519.PublicKey(x)); err != nil {
				return nil, err
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("JWKS: no RSA or Ed25519 signing key")
	}
	return out, nil
}
