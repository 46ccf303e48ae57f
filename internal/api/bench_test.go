package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"rain/internal/auth"
	"rain/internal/grab"
	"rain/internal/limit"
	"rain/internal/pool"

	"github.com/golang-jwt/jwt/v5"
	"github.com/valyala/fasthttp"
)

// fixedGrabber answers every grab with the same grant: BenchmarkServeGrab
// measures the HTTP layer (admission, decoding, the worker pool, the answer)
// apart from the shards, which BenchmarkGrab in internal/grab measures.
type fixedGrabber struct{}

func (fixedGrabber) Grab(context.Context, string, string) (grab.Result, error) {
	return grab.Result{Outcome: grab.Granted, Amount: 123, Serial: 4711, ExpiresAt: time.Unix(1_800_000_000, 0)}, nil
}

// BenchmarkServeGrab: rain's POST /grab handler, through the worker pool,
// beside the minimal handler (encoding/json in and out, no pool), both on a
// grabber that answers at once, with allocations; and rain's with user auth
// on (the token verified on every grab: HS256, EdDSA, RS256) and with both
// rate limits on.
func BenchmarkServeGrab(b *testing.B) {
	body := `{"pool_id":"cny2027","user_id":"u_123456"}`
	authz := ""
	run := func(b *testing.B, h http.Handler) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				w := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/grab", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if authz != "" {
					req.Header.Set("Authorization", authz)
				}
				h.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Errorf("answer %d %s", w.Code, w.Body)
					return
				}
			}
		})
	}
	b.Run("rain", func(b *testing.B) {
		workers, err := pool.New(pool.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer workers.Close(time.Second)
		run(b, New(Config{Grabber: fixedGrabber{}, Runner: workers, Ready: func(context.Context) grab.Readiness { return grab.Readiness{Ready: true} }}))
	})
	for _, c := range []struct {
		name   string
		method jwt.SigningMethod
		spec   func(b *testing.B) (string, any)
	}{
		{"rain-hs256", jwt.SigningMethodHS256, func(b *testing.B) (string, any) {
			key := []byte(strings.Repeat("k", 32))
			return "hs256:" + benchFile(b, key), key
		}},
		{"rain-eddsa", jwt.SigningMethodEdDSA, func(b *testing.B) (string, any) {
			pub, priv, _ := ed25519.GenerateKey(rand.Reader)
			der, _ := x509.MarshalPKIXPublicKey(pub)
			return "eddsa:" + benchFile(b, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), priv
		}},
		{"rain-rs256", jwt.SigningMethodRS256, func(b *testing.B) (string, any) {
			k, _ := rsa.GenerateKey(rand.Reader, 2048)
			der, _ := x509.MarshalPKIXPublicKey(&k.PublicKey)
			return "rs256:" + benchFile(b, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), k
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			spec, key := c.spec(b)
			users, err := auth.NewUsers(auth.UserConfig{Spec: spec})
			if err != nil {
				b.Fatal(err)
			}
			tok, err := jwt.NewWithClaims(c.method, jwt.MapClaims{"sub": "u_123456", "exp": time.Now().Add(time.Hour).Unix()}).SignedString(key)
			if err != nil {
				b.Fatal(err)
			}
			authz = "Bearer " + tok
			defer func() { authz = "" }()
			workers, err := pool.New(pool.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer workers.Close(time.Second)
			run(b, New(Config{Grabber: fixedGrabber{}, Runner: workers, Users: users,
				Ready: func(context.Context) grab.Readiness { return grab.Readiness{Ready: true} }}))
		})
	}
	b.Run("rain-rate-limits", func(b *testing.B) {
		workers, err := pool.New(pool.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer workers.Close(time.Second)
		run(b, New(Config{Grabber: fixedGrabber{}, Runner: workers,
			UserLimit: limit.New(limit.Config{Rate: 1e9, Burst: 1e9}), IPLimit: limit.New(limit.Config{Rate: 1e9, Burst: 1e9}),
			Ready: func(context.Context) grab.Readiness { return grab.Readiness{Ready: true} }}))
	})
	b.Run("encoding-json-baseline", func(b *testing.B) {
		g := fixedGrabber{}
		run(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				PoolID string `json:"pool_id"`
				UserID string `json:"user_id"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			res, _ := g.Grab(r.Context(), req.PoolID, req.UserID)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"status": "granted", "pool_id": req.PoolID, "user_id": req.UserID,
				"amount_cents": res.Amount, "serial": res.Serial, "expires_at": res.ExpiresAt})
		}))
	})
}

// BenchmarkServeFastGrab: POST /grab as the listener serves it (serveFast
// on fasthttp's request, the worker pool, the answer), on a grabber that
// answers at once, with allocations: what the HTTP layer costs a grab in
// the process beside the network's syscalls (scripts/bench.sh budget
// measures the whole, over loopback).
func BenchmarkServeFastGrab(b *testing.B) {
	workers, err := pool.New(pool.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer workers.Close(time.Second)
	s := New(Config{Grabber: fixedGrabber{}, Runner: workers, Ready: func(context.Context) grab.Readiness { return grab.Readiness{Ready: true} }})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var ctx fasthttp.RequestCtx
		conn, peer := net.Pipe() // a connection that takes deadlines; nothing goes over it
		defer conn.Close()
		defer peer.Close()
		for pb.Next() {
			ctx.Init2(conn, nil, false)
			ctx.Request.Header.SetMethod("POST")
			ctx.Request.SetRequestURI("/grab")
			ctx.Request.Header.SetHost("rain")
			ctx.Request.Header.SetContentType("application/json")
			ctx.Request.SetBodyString(`{"pool_id":"cny2027","user_id":"u_123456"}`)
			s.serveFast(&ctx)
			if c := ctx.Response.StatusCode(); c != 200 {
				b.Errorf("answer %d %s", c, ctx.Response.Body())
				return
			}
		}
	})
}

func benchFile(b *testing.B, content []byte) string {
	p := filepath.Join(b.TempDir(), "key")
	if err := os.WriteFile(p, content, 0o600); err != nil {
		b.Fatal(err)
	}
	return p
}
