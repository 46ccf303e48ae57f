// Package timeline is the per-second record of a rainload run: the JSON-lines file
// that -timeline writes, one Sample a line, and that the HTML report reads.
package timeline

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// Sample is one second of a run. Its JSON field names are stable: scripts and the
// report read them.
//
// Requests are counted in the second they were due (offered, dropped) or the
// second they were answered (answered, goodput, shed, statuses, latencies), so
// under a backlog answers trail the load that caused them.
type Sample struct {
	// T is the second the sample covers, [T, T+1) seconds after the start.
	T int `json:"t"`
	// Offered is how many arrivals the schedule had due this second: sent plus
	// dropped.
	Offered int64 `json:"offered"`
	// Answered is how many HTTP answers arrived this second (transport errors
	// are not answers).
	Answered int64 `json:"answered"`
	// Goodput is the answers that docs/api.md means as answers: granted,
	// already_granted, sold_out, not_found, not_started and ended.
	Goodput int64 `json:"goodput"`
	// Shed is the answers that were 503 overloaded.
	Shed int64 `json:"shed"`
	// Dropped is the arrivals due this second that found -max-inflight requests
	// already in flight and were not sent.
	Dropped int64 `json:"dropped"`
	// Inflight is the requests sent and not yet finished at the end of the second.
	Inflight int64 `json:"inflight"`
	// Statuses counts this second's finished requests by status (the eight of
	// docs/api.md, "error" and "transport"); statuses with no request are left out.
	Statuses map[string]int64 `json:"statuses"`
	// P50Ms, P99Ms and P999Ms are latency percentiles in milliseconds of the
	// accepted requests (everything but overloaded and transport errors) that
	// finished this second, measured from when each was due; 0 when none did.
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	P999Ms float64 `json:"p999_ms"`
	// Gauges holds the last values scraped from the target's GET /metrics, by
	// metric name (rain_pool_capacity, rain_pool_running, rain_pool_waiting,
	// rain_pool_shed_total, rain_pool_target; summed over labels); absent when
	// not scraping or when the target exports none of them.
	Gauges map[string]float64 `json:"gauges,omitempty"`
	// RemainingCount and RemainingCents are the pool's stock from the last
	// scrape of GET /admin/pools/{pool}; absent when not scraped.
	RemainingCount *int64 `json:"remaining_count,omitempty"`
	RemainingCents *int64 `json:"remaining_cents,omitempty"`
}

// Read reads samples written one JSON object a line; blank lines are skipped.
func Read(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var s Sample
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		out = append(out, s)
	}
	return out, sc.Err()
}
