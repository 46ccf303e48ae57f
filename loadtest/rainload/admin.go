package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// scrapedMetrics are the GET /metrics series recorded in the timeline (issue 5's
// worker pool exports them); each is summed over its label sets.
var scrapedMetrics = []string{
	"rain_pool_capacity", "rain_pool_running", "rain_pool_waiting",
	"rain_pool_shed_total", "rain_pool_target",
}

// admin talks to the target's operator endpoints: the preload before a run and the
// scrape during it. It has its own net/http client, apart from the load's
// connections, so a scrape neither waits behind the load nor counts in it.
type admin struct {
	cfg    *config
	tr     *http.Transport
	client *http.Client
	stderr io.Writer
	errs   atomic.Int64 // failed scrapes

	mu       sync.Mutex // guards the fields below
	gauges   map[string]float64
	remCount *int64
	remCents *int64
	warned   map[string]bool // endpoints whose first failure was reported
}

func newAdmin(cfg *config, stderr io.Writer) *admin {
	tr := &http.Transport{MaxIdleConnsPerHost: 2}
	return &admin{cfg: cfg, tr: tr, client: &http.Client{Transport: tr}, stderr: stderr, warned: map[string]bool{}}
}

// close drops the idle connections (and their goroutines).
func (a *admin) close() { a.tr.CloseIdleConnections() }

func (a *admin) url(path string) string {
	return strings.TrimSuffix(a.cfg.base.String(), "/") + path
}

// do sends an authorized request for path under -url and returns the answer's
// code and body (at most 1 MiB).
func (a *admin) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	return a.doURL(ctx, method, a.url(path), body, true)
}

// doURL is do for a whole URL; the admin token goes only with authorized.
func (a *admin) doURL(ctx context.Context, method, u string, body []byte, authorized bool) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if authorized {
		req.Header.Set("Authorization", "Bearer "+a.cfg.adminToken)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, err
}

// preload creates the pool with POST /admin/pools; 201 (created) and 200 (the
// same pool already loaded) are success.
func (a *admin) preload(ctx context.Context) error {
	body, err := json.Marshal(map[string]any{
		"pool_id": a.cfg.pool, "count": a.cfg.preloadN, "total_cents": a.cfg.preloadSum,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	code, b, err := a.do(ctx, http.MethodPost, "/admin/pools", body)
	if err != nil {
		return fmt.Errorf("preload %s: %w", a.cfg.pool, err)
	}
	if code != http.StatusCreated && code != http.StatusOK {
		return fmt.Errorf("preload %s: POST /admin/pools answered %d: %s", a.cfg.pool, code, bytes.TrimSpace(b))
	}
	return nil
}

// scrapeLoop scrapes once a second until ctx is done.
func (a *admin) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		a.scrape(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// scrape reads the pool gauges and the pool's stock once. A target without
// either endpoint (the baseline) just leaves them out of the timeline.
func (a *admin) scrape(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 900*time.Millisecond)
	defer cancel()
	// /metrics takes no token: it never goes there (nor to -metrics-url).
	metrics := a.url("/metrics")
	if a.cfg.metricsURL != "" {
		metrics = a.cfg.metricsURL
	}
	if code, b, err := a.doURL(ctx, http.MethodGet, metrics, nil, false); a.ok("/metrics", code, err) {
		if g := parseMetrics(b); len(g) > 0 {
			a.mu.Lock()
			a.gauges = g
			a.mu.Unlock()
		}
	}
	path := "/admin/pools/" + url.PathEscape(a.cfg.pool)
	if code, b, err := a.do(ctx, http.MethodGet, path, nil); a.ok(path, code, err) {
		var st struct {
			RemainingCount *int64 `json:"remaining_count"`
			RemainingCents *int64 `json:"remaining_cents"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			a.ok(path, code, err)
			return
		}
		a.mu.Lock()
		a.remCount, a.remCents = st.RemainingCount, st.RemainingCents
		a.mu.Unlock()
	}
}

// ok reports whether a scrape of path succeeded; a failure is counted, and the
// first of each path is reported on stderr.
func (a *admin) ok(path string, code int, err error) bool {
	if err == nil && code == http.StatusOK {
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false // the run is over
	}
	a.errs.Add(1)
	a.mu.Lock()
	first := !a.warned[path]
	a.warned[path] = true
	a.mu.Unlock()
	if first {
		if err == nil {
			err = fmt.Errorf("answered %d", code)
		}
		fmt.Fprintf(a.stderr, "rainload: scrape %s: %v (further failures only counted)\n", path, err)
	}
	return false
}

// latest returns the last scraped values (nil when none).
func (a *admin) latest() (map[string]float64, *int64, *int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gauges, a.remCount, a.remCents
}

// parseMetrics returns the scrapedMetrics found in a Prometheus text exposition,
// each summed over its label sets.
func parseMetrics(b []byte) map[string]float64 {
	var m map[string]float64
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name = line[:i]
			j := strings.LastIndexByte(line, '}')
			if j < 0 {
				continue
			}
			rest = line[j+1:]
		}
		wanted := false
		for _, w := range scrapedMetrics {
			wanted = wanted || name == w
		}
		if !wanted {
			continue
		}
		fields := strings.Fields(rest) // value [timestamp]
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		if m == nil {
			m = map[string]float64{}
		}
		m[name] += v
	}
	return m
}
