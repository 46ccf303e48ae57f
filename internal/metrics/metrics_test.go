package metrics

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain/internal/grab"
	"rain/internal/wait/waittest"
)

// TestStockReadAtMostOncePerInterval: however many scrapes come (several
// scrapers, a client flooding /metrics), the stock is read from the shards
// at most once a StockEvery; a scrape after it reads again and shows the
// new stock.
func TestStockReadAtMostOncePerInterval(t *testing.T) {
	r := New(Build{Version: "test"})
	var reads atomic.Int64
	var left atomic.Int64
	left.Store(10)
	r.Stock(func(context.Context) []grab.SubPoolStock {
		reads.Add(1)
		return []grab.SubPoolStock{{Pool: "p", Index: 0, Shard: "s1", RemainingCount: left.Load(), RemainingCents: 100 * left.Load()}}
	})
	h := r.Handler()
	scrape := func() string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if body := scrape(); !strings.Contains(body, `rain_stock_remaining_packets{pool="p",shard="s1",sub_pool="0"} 10`) {
				t.Errorf("scrape lacks the stock: %.300s", body)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if most := 1 + int64(elapsed/StockEvery); reads.Load() > most {
		t.Fatalf("%d reads of the stock for 50 scrapes in %v, want at most %d", reads.Load(), elapsed, most)
	}
	left.Store(7)
	waittest.Until(t, 3*StockEvery, "a scrape after the stock's interval shows the new stock", func() bool {
		return strings.Contains(scrape(), `rain_stock_remaining_packets{pool="p",shard="s1",sub_pool="0"} 7`)
	})
	if reads.Load() < 2 {
		t.Fatalf("%d reads after the interval, want a second", reads.Load())
	}
}
