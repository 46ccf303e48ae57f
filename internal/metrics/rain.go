package metrics

// This file defines the series read from rain's components at scrape time.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"rain/internal/grab"
	"rain/internal/idgen"
	"rain/internal/limit"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/settle"
	"rain/internal/shard"

	"github.com/prometheus/client_golang/prometheus"
)

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Pool registers the worker pool's series.
func (r *Registry) Pool(stats func() pool.Stats) {
	r.Gauge("rain_pool_capacity", "Workers the pool may run now.", func() float64 { return float64(stats().Capacity) })
	r.Gauge("rain_pool_target", "Capacity the controller aims at (rate x service time x headroom).", func() float64 { return float64(stats().Target) })
	r.Gauge("rain_pool_running", "Workers running a task.", func() float64 { return float64(stats().Running) })
	r.Gauge("rain_pool_waiting", "Callers waiting for a worker.", func() float64 { return float64(stats().Waiting) })
	r.Counter("rain_pool_shed_total", "Grabs refused because the pool and its queue were full.", func() float64 { return float64(stats().Shed) })
	r.Counter("rain_pool_panics_total", "Tasks that panicked (recovered).", func() float64 { return float64(stats().Panics) })
}

// Reaper registers the reaper's series.
func (r *Registry) Reaper(stats func() reaper.Stats) {
	r.Gauge("rain_reaper_leader", "1 while this instance holds the reaper lock.", func() float64 { return b2f(stats().Leader) })
	r.Counter("rain_reaper_released_total", "Expired grants released back to the stock.", func() float64 { return float64(stats().Released) })
	r.Counter("rain_reaper_released_cents_total", "Cents of expired grants released back to the stock.", func() float64 { return float64(stats().ReleasedCents) })
	r.Gauge("rain_reaper_lag_seconds", "How long past its deadline the oldest overdue grant was at the last sweep.", func() float64 { return stats().Lag.Seconds() })
	r.Counter("rain_reaper_sweeps_total", "Sweeps made.", func() float64 { return float64(stats().Sweeps) })
	r.Counter("rain_reaper_sweep_errors_total", "Sweeps that met an error (a shard down).", func() float64 { return float64(stats().Errors) })
	r.Counter("rain_reaper_lost_locks_total", "Times the lock was lost while sweeping.", func() float64 { return float64(stats().LostLocks) })
}

// Serials registers the grant serial generator's series.
func (r *Registry) Serials(stats func() idgen.Stats) {
	r.Gauge("rain_serial_step", "IDs the next serial segment will reserve.", func() float64 { return float64(stats().Step) })
	r.Counter("rain_serial_loads_total", "Serial segments loaded.", func() float64 { return float64(stats().Loads) })
	r.Counter("rain_serial_load_errors_total", "Failed serial segment loads.", func() float64 { return float64(stats().LoadErrors) })
	r.Counter("rain_serial_stalls_total", "Times a grab waited for a serial segment.", func() float64 { return float64(stats().Stalls) })
	r.Counter("rain_serial_refusals_total", "Serial segments refused for going backwards.", func() float64 { return float64(stats().Refusals) })
}

// Settle registers the settlement worker's series.
func (r *Registry) Settle(stats func() settle.Stats) {
	r.Counter("rain_settle_delivered_total", "Grants confirmed and delivered to the sink.", func() float64 { return float64(stats().Delivered) })
	r.Counter("rain_settle_expired_total", "Outbox grants already released at their deadline: not paid.", func() float64 { return float64(stats().Expired) })
	r.Counter("rain_settle_anomalies_total", "Grants of the outbox with no matching grant, unreadable release entries, and paid grants whose confirm was lost.", func() float64 { return float64(stats().Anomalies) })
	r.Counter("rain_settle_failures_total", "Failed reads of the outboxes, confirms, replica waits, deliveries and acknowledgments (each retried).", func() float64 { return float64(stats().Failures) })
	r.Counter("rain_settle_conflicts_total", "What left an outbox entry pending for an operator, once each: a grant whose serial the sink had paid for another grant, an amount not the grant's, a grant paid and then released, or an entry that cannot be read.", func() float64 { return float64(stats().Conflicts) })
	r.Gauge("rain_settle_left_for_operator", "Outbox entries left pending for an operator that the last pass over each shard met, summed: each blocks its pool's close until an operator clears it.", func() float64 { return float64(stats().LeftForOperator) })
	r.Gauge("rain_settle_lag_seconds", "Age of the oldest outbox entry that may be unsettled, the largest over the shards (while a shard's outboxes cannot be read, from the last pass that read them all); 0 when settlement has caught up.", func() float64 { return stats().Lag.Seconds() })
}

// Durability registers rain_durability_relaxed; relaxed says whether it
// is 1 now (nil: never), as a shard that did not answer at start may be
// found weak later.
func (r *Registry) Durability(relaxed func() bool) {
	r.Gauge("rain_durability_relaxed", "1 when rain runs with --durability relaxed on shards that can lose acknowledged grants.", func() float64 { return b2f(relaxed != nil && relaxed()) })
}

// ShortOfCPU registers rain_grab_cpu_short.
func (r *Registry) ShortOfCPU(short func() bool) {
	r.Gauge("rain_grab_cpu_short", "1 while the process is short of CPU (its goroutines wait to run), when the claim lanes wait longer to fill their batches.", func() float64 { return b2f(short()) })
}

// Connections registers the HTTP connection series.
func (r *Registry) Connections(stats func() (open int, closed int64)) {
	r.Gauge("rain_http_connections", "Client connections open.", func() float64 { o, _ := stats(); return float64(o) })
	r.Counter("rain_http_connections_closed_total", "Idle client connections closed to stay under --max-conns.", func() float64 { _, c := stats(); return float64(c) })
}

// Shards registers the per-shard series: the claim path's breaker and
// failures (from grab) and go-redis's connection pool (from the set).
func (r *Registry) Shards(stats func() []grab.ShardStats, set *shard.Set) {
	shard := []string{"shard"}
	per := func(f func(grab.ShardStats) float64) func() []Sample {
		return func() []Sample {
			st := stats()
			out := make([]Sample, len(st))
			for i, s := range st {
				out[i] = Sample{Labels: []string{s.Name}, V: f(s)}
			}
			return out
		}
	}
	// two: a series per shard and each of two values, a and b, of a second
	// label.
	two := func(a, b string, f func(grab.ShardStats) (float64, float64)) func() []Sample {
		return func() []Sample {
			var out []Sample
			for _, s := range stats() {
				va, vb := f(s)
				out = append(out, Sample{Labels: []string{s.Name, a}, V: va}, Sample{Labels: []string{s.Name, b}, V: vb})
			}
			return out
		}
	}
	r.GaugeVec("rain_shard_breaker_state", "The shard's circuit breaker: 0 closed, 1 open (its users are answered 503 at once), 2 half-open (a probe is out).",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.Breaker) }))
	r.CounterVec("rain_shard_breaker_trips_total", "Times the shard's breaker opened.",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.Trips) }))
	r.CounterVec("rain_shard_batch_failures_total", "Batches of claims the shard did not answer (network error or timeout).",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.Failures) }))
	r.CounterVec("rain_shard_claims_refused_total", "Claims answered 503 without being sent, by shard and by why: breaker_open, or bulkhead (the late shard had its share of the workers).",
		[]string{"shard", "reason"}, two("breaker_open", "bulkhead", func(s grab.ShardStats) (float64, float64) { return float64(s.Refused), float64(s.Busy) }))
	r.GaugeVec("rain_shard_claims_in_flight", "Claims queued or in flight to the shard.",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.InFlight) }))
	r.CounterVec("rain_shard_redirects_total", "Batches of claims a cluster shard's primary sent elsewhere (their slot moved or was moving: MOVED, ASK, TRYAGAIN), followed there.",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.Redirected) }))
	r.CounterVec("rain_shard_lingers_total", fmt.Sprintf("Times the shard's claim lane waited for the claims it expected before sending a batch (lingered, only while the process is short of CPU and for a batch of fewer than %d claims), or did not because the process had CPU to spare (skipped).", grab.LingerFull),
		[]string{"shard", "outcome"}, two("lingered", "skipped", func(s grab.ShardStats) (float64, float64) { return float64(s.Lingered), float64(s.LingerSkipped) }))
	r.CounterVec("rain_shard_linger_claims_total", "Claims the shard's claim lane took into a batch while it waited for them.",
		shard, per(func(s grab.ShardStats) float64 { return float64(s.LingerClaims) }))

	redisPool := func(f func(hits, misses, timeouts, total, idle, stale uint32) float64) func() []Sample {
		return func() []Sample {
			var out []Sample
			for _, name := range set.Names() {
				p := set.Client(name).PoolStats()
				out = append(out, Sample{Labels: []string{name}, V: f(p.Hits, p.Misses, p.Timeouts, p.TotalConns, p.IdleConns, p.StaleConns)})
			}
			return out
		}
	}
	r.CounterVec("rain_redis_pool_hits_total", "Times a free connection was found in the shard client's pool.",
		shard, redisPool(func(h, _, _, _, _, _ uint32) float64 { return float64(h) }))
	r.CounterVec("rain_redis_pool_misses_total", "Times the shard client's pool had no free connection and dialed.",
		shard, redisPool(func(_, m, _, _, _, _ uint32) float64 { return float64(m) }))
	r.CounterVec("rain_redis_pool_timeouts_total", "Times waiting for a connection of the shard client's pool timed out.",
		shard, redisPool(func(_, _, t, _, _, _ uint32) float64 { return float64(t) }))
	r.GaugeVec("rain_redis_pool_connections", "Connections in the shard client's pool.",
		shard, redisPool(func(_, _, _, n, _, _ uint32) float64 { return float64(n) }))
	r.GaugeVec("rain_redis_pool_idle_connections", "Idle connections in the shard client's pool.",
		shard, redisPool(func(_, _, _, _, i, _ uint32) float64 { return float64(i) }))
	r.CounterVec("rain_redis_pool_stale_connections_total", "Stale connections the shard client's pool closed.",
		shard, redisPool(func(_, _, _, _, _, s uint32) float64 { return float64(s) }))
	r.GaugeVec("rain_shard_weight", "The shard's weight in the ring.", shard, func() []Sample {
		var out []Sample
		for _, name := range set.Names() {
			out = append(out, Sample{Labels: []string{name}, V: float64(set.Weight(name))})
		}
		return out
	})
}

// StockEvery is how often the stock is read from the shards at most: a
// scrape within it of the last read answers that read, and scrapes at the
// same time share one read, so no number of scrapers (nor a client flooding
// /metrics) makes more shard reads than one a StockEvery.
const StockEvery = time.Second

// StockBudget bounds how long a scrape waits for the shards' stock: a
// frozen shard's sub-pools are left out of that scrape rather than holding
// it (and every scrape after it) up.
const StockBudget = 200 * time.Millisecond

// Stock registers the stock of every sub-pool of the open pools the
// instance serves, read from the shards at scrape time (one read for both
// families, bounded by StockBudget, at most one per StockEvery). It is not
// part of Gatherer's view: the dashboard's timeline does not read the
// shards every second.
func (r *Registry) Stock(read func(ctx context.Context) []grab.SubPoolStock) {
	labels := []string{"pool", "sub_pool", "shard"}
	r.scraped.MustRegister(&stockCollector{read: read,
		packets: prometheus.NewDesc("rain_stock_remaining_packets", "Packets left in a sub-pool's stock.", labels, nil),
		count: prometheus.NewDesc("rain_stock_remaining_count", "Deprecated: rain_stock_remaining_packets (the same figure; "+
			"a _count suffix is for histograms and summaries). Removed in the next release.", labels, nil),
		cents: prometheus.NewDesc("rain_stock_remaining_cents", "Cents left in a sub-pool's stock.", labels, nil)})
}

// Deprecated lists the series still exported under an old name for one
// release, each with the name that replaces it: dashboards and rules move
// to the new name meanwhile.
var Deprecated = map[string]string{"rain_stock_remaining_count": "rain_stock_remaining_packets"}

type stockCollector struct {
	read                  func(ctx context.Context) []grab.SubPoolStock
	packets, count, cents *prometheus.Desc

	mu   sync.Mutex // held across a read: concurrent scrapes share it
	at   time.Time  // of the last read
	last []grab.SubPoolStock
}

// stock returns the last read if it is younger than StockEvery, else reads.
func (c *stockCollector) stock() []grab.SubPoolStock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < StockEvery {
		return c.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), StockBudget)
	defer cancel()
	c.last, c.at = c.read(ctx), time.Now()
	return c.last
}

func (c *stockCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.count
	ch <- c.cents
}

func (c *stockCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stock() {
		lv := []string{s.Pool, strconv.Itoa(s.Index), s.Shard}
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.GaugeValue, float64(s.RemainingCount), lv...)
		ch <- prometheus.MustNewConstMetric(c.count, prometheus.GaugeValue, float64(s.RemainingCount), lv...)
		ch <- prometheus.MustNewConstMetric(c.cents, prometheus.GaugeValue, float64(s.RemainingCents), lv...)
	}
}

// RateLimits registers the keys each rate limiter remembers (nil limiters,
// those off, are left out).
func (r *Registry) RateLimits(limits map[string]*limit.Limiter) {
	r.GaugeVec("rain_rate_limit_keys", "Users or client addresses whose rate a limiter remembers (bounded by --rate-limit-keys).",
		[]string{"limit"}, func() []Sample {
			var out []Sample
			for name, l := range limits {
				if l != nil {
					out = append(out, Sample{Labels: []string{name}, V: float64(l.Len())})
				}
			}
			return out
		})
}
