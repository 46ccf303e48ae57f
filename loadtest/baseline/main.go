// Command baseline is the minimal design that rain's grab path is measured against
// in scripts/bench.sh: one net/http server, one go-redis client, one Redis, no worker
// pool, and exactly one Script.Run (EVALSHA, EVAL on NOSCRIPT) per POST /grab.
//
// Given several Redis addresses (-redis a,b,...), it is the minimal design sharded
// as rain is: each user's grabs go to one of them, by a hash of the user id, and a
// pool's stock is dealt out among them (a user whose shard is empty is told sold
// out, with no spillover). BASELINE_SHARDS=N scripts/bench.sh runs it so, to
// measure what the shards alone cost on one machine.
//
// It speaks just enough of docs/api.md to be loaded the same way as rain:
//
//	POST /admin/pools  {"pool_id","total_cents","count"} with Authorization: Bearer <token>
//	POST /grab         {"pool_id","user_id"}
//
// A pool is loadtest/minimal's: a Redis list bl:{pool}:stock of pre-split amounts (an
// equal split, the remainder spread over the first ones) and a hash bl:{pool}:grants of
// user -> amount, claimed by minimal.ClaimSrc. It has no serials, holds, expiry,
// sub-pools or shards: that is rain's extra work per grab, and the point of the
// comparison. Not for production.
//
//	go run ./loadtest/baseline -listen 127.0.0.1:8081 -redis 127.0.0.1:6379 -admin-token T
package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"rain"
	"rain/loadtest/minimal"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
)

// maxBody is docs/api.md's limit on a /grab body.
const maxBody = 4 << 10

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "baseline:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("baseline", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8081", "HTTP listen address")
	addr := fs.String("redis", "127.0.0.1:6379", "Redis `address`, or several separated by commas: the users split over them by a hash of their id")
	token := fs.String("admin-token", "", "bearer token for /admin/pools (required)")
	poolSize := fs.Int("redis-pool", 0, "go-redis PoolSize; 0 = go-redis default (10 × GOMAXPROCS)")
	fixed := fs.Bool("fixed", false, "POST /grab only decodes and validates the request and answers a fixed sold_out JSON, "+
		"touching no Redis: the ceiling of a handler that answers locally (bench.sh soldout)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *token == "" {
		return errors.New("-admin-token is required")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	s := &server{claim: redis.NewScript(minimal.ClaimSrc), token: []byte(*token), log: log, fixed: *fixed}
	for a := range strings.SplitSeq(*addr, ",") {
		rdb := redis.NewClient(&redis.Options{Addr: a, PoolSize: *poolSize})
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("ping %s: %w", a, err)
		}
		s.shards = append(s.shards, rdb)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /grab", s.grab)
	mux.HandleFunc("POST /admin/pools", s.preload)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("baseline listening", "listen", ln.Addr().String(), "redis", *addr)

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// In-flight grabs finish before Redis is closed (the deferred rdb.Close).
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("baseline stopped")
	return nil
}

type server struct {
	shards []*redis.Client // a user's grabs go to shards[xxhash(user) % len]
	claim  *redis.Script
	token  []byte
	log    *slog.Logger
	fixed  bool // answer every valid grab sold_out without Redis
}

type grabRequest struct {
	PoolID string `json:"pool_id"`
	UserID string `json:"user_id"`
}

type grabResponse struct {
	Status      string `json:"status"`
	PoolID      string `json:"pool_id"`
	UserID      string `json:"user_id"`
	AmountCents int64  `json:"amount_cents,omitempty"`
	Error       string `json:"error,omitempty"`
}

func (s *server) grab(w http.ResponseWriter, r *http.Request) {
	var req grabRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		reply(w, http.StatusBadRequest, grabResponse{Status: "invalid", Error: err.Error()})
		return
	}
	if !rain.ValidID(req.PoolID) || !rain.ValidID(req.UserID) {
		reply(w, http.StatusBadRequest, grabResponse{Status: "invalid", PoolID: req.PoolID, UserID: req.UserID, Error: "bad pool_id or user_id"})
		return
	}
	resp := grabResponse{PoolID: req.PoolID, UserID: req.UserID}
	if s.fixed {
		resp.Status = "sold_out"
		reply(w, http.StatusGone, resp)
		return
	}
	rdb := s.shards[xxhash.Sum64String(req.UserID)%uint64(len(s.shards))]
	res, err := s.claim.Run(r.Context(), rdb, minimal.Keys(req.PoolID), req.UserID).Int64Slice()
	if err != nil || len(res) != 2 {
		// Not logged: this is the hot path, and a failing Redis shows up in the
		// benchmark as 503s in grab.lua's status counts.
		resp.Status = "overloaded"
		w.Header().Set("Retry-After", "1")
		reply(w, http.StatusServiceUnavailable, resp)
		return
	}
	code := http.StatusOK
	switch res[0] {
	case 2:
		resp.Status, resp.AmountCents = "granted", res[1]
	case 1:
		resp.Status, resp.AmountCents = "already_granted", res[1]
	case 0:
		resp.Status, code = "sold_out", http.StatusGone
	default:
		resp.Status, code = "not_found", http.StatusNotFound
	}
	reply(w, code, resp)
}

type preloadRequest struct {
	PoolID     string `json:"pool_id"`
	TotalCents int64  `json:"total_cents"`
	Count      int64  `json:"count"`
}

// preload pushes count amounts into the pool's stock, dealt out among the shards
// in turn. A pool id already loaded answers 200 and pushes nothing (SETNX on the
// meta key of the first shard); it does not compare specs, and a preload that dies
// midway is not finished by a second one. Grabs see the stock as it arrives:
// scripts/bench.sh loads only after the preload has answered.
func (s *server) preload(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), append([]byte("Bearer "), s.token...)) != 1 {
		reply(w, http.StatusUnauthorized, map[string]string{"error": "missing or bad admin token"})
		return
	}
	var req preloadRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
		reply(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	if !rain.ValidID(req.PoolID) || req.Count <= 0 || req.TotalCents < req.Count {
		reply(w, http.StatusBadRequest, map[string]string{"error": "need a valid pool_id, count > 0, total_cents >= count"})
		return
	}
	ctx := r.Context()
	k := minimal.Keys(req.PoolID)
	fresh, err := s.shards[0].SetNX(ctx, k[2], req.Count, 0).Result()
	if err != nil {
		reply(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	if !fresh {
		reply(w, http.StatusOK, map[string]string{"pool_id": req.PoolID})
		return
	}
	start := time.Now()
	if err := s.push(ctx, k, req.TotalCents, req.Count); err != nil {
		s.log.Error("preload", "pool_id", req.PoolID, "err", err)
		reply(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	s.log.Info("preloaded", "pool_id", req.PoolID, "count", req.Count, "took", time.Since(start))
	reply(w, http.StatusCreated, map[string]string{"pool_id": req.PoolID})
}

// push stocks count amounts summing to total: total/count each, one more
// cent on the first total%count; amount i to shard i % len(shards), each
// shard's meta key set (the first one's is, by preload) so that an empty
// shard answers sold out.
func (s *server) push(ctx context.Context, k []string, total, count int64) error {
	each, extra := total/count, total%count
	n := int64(len(s.shards))
	for sh, rdb := range s.shards {
		amounts := func(yield func(int64) bool) {
			for i := int64(sh); i < count; i += n {
				a := each
				if i < extra {
					a++
				}
				if !yield(a) {
					return
				}
			}
		}
		if err := minimal.Stock(ctx, rdb, k, count, amounts); err != nil {
			return err
		}
	}
	return nil
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
