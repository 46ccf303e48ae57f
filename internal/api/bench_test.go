package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"rain/internal/grab"
	"rain/internal/pool"
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
// grabber that answers at once, with allocations.
func BenchmarkServeGrab(b *testing.B) {
	body := `{"pool_id":"cny2027","user_id":"u_123456"}`
	run := func(b *testing.B, h http.Handler) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("POST", "/grab", strings.NewReader(body)))
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
