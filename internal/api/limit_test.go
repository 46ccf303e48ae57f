package api

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"rain/internal/limit"
	"rain/internal/redistest"
)

// TestBotIsCutToItsRate: one client cycling 10,000 made-up user ids from
// one address (behind the trusted proxy header) is cut to the per-IP rate
// with 429 rate_limited and Retry-After, while 20 other clients, each its
// own address and user, are never limited and all get their grant. Each
// user's own rate applies too.
func TestBotIsCutToItsRate(t *testing.T) {
	const ipRate, ipBurst = 50, 20
	s := newStack(t, 2, redistest.Options{}, func(cfg *Config) {
		cfg.IPLimit = limit.New(limit.Config{Rate: ipRate, Burst: ipBurst})
		cfg.UserLimit = limit.New(limit.Config{Rate: 0.001, Burst: 2}) // a token each 1,000 s: none comes back within the test
		cfg.ClientIPHeader = "X-Forwarded-For"
	})
	s.preload(t, `{"pool_id":"p","total_cents":10000000,"count":100000}`)
	post := func(ip, body string) response {
		req, _ := http.NewRequest("POST", s.url+"/grab", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", "198.51.100.1, "+ip) // the last hop is the one our proxy saw
		resp, err := s.client.Do(req)
		if err != nil {
			t.Error(err)
			return response{}
		}
		defer resp.Body.Close()
		r := response{Code: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
		return r
	}

	start := time.Now()
	var botOK, botLimited, botOther int
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 10_000 {
			switch r := post("203.0.113.7", fmt.Sprintf(`{"pool_id":"p","user_id":"bot%d"}`, i)); r.Code {
			case 200:
				botOK++
			case 429:
				if r.RetryAfter == "" {
					t.Error("429 without Retry-After")
				}
				botLimited++
			default:
				botOther++
			}
		}
	})
	var mu sync.Mutex
	var lat []time.Duration
	others := 0
	for c := range 20 {
		wg.Go(func() {
			ip := fmt.Sprintf("192.0.2.%d", c+1)
			for i := range 5 {
				t0 := time.Now()
				r := post(ip, fmt.Sprintf(`{"pool_id":"p","user_id":"real%d-%d"}`, c, i))
				mu.Lock()
				lat = append(lat, time.Since(t0))
				if r.Code == 200 {
					others++
				}
				mu.Unlock()
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	took := time.Since(start).Seconds()
	allowed := ipBurst + int(ipRate*took) + 2
	if botOK > allowed || botLimited < 10_000-allowed || botOther != 0 {
		t.Fatalf("bot: %d granted, %d limited, %d other in %.1fs; want at most %d granted (rate %d/s + burst %d), the rest 429",
			botOK, botLimited, botOther, took, allowed, ipRate, ipBurst)
	}
	if others != 100 {
		t.Fatalf("other clients got %d of 100 grants, want all", others)
	}
	slices.Sort(lat)
	t.Logf("bot: %d granted, %d limited in %.1fs; others' p50 %v p99 %v", botOK, botLimited, took, lat[len(lat)/2], lat[len(lat)*99/100])

	// The per-user rate: one user asking again and again.
	codes := map[int]int{}
	for range 10 {
		codes[post("192.0.2.200", `{"pool_id":"p","user_id":"eager"}`).Code]++
	}
	if codes[200] != 2 || codes[429] != 8 {
		t.Fatalf("one user 10 times at once: %v, want 2 answered (burst) and 8 rate_limited", codes)
	}
	got := s.scrape(t)
	if got[`rain_grabs_total{status="rate_limited"}`] != float64(botLimited+8) {
		t.Fatalf("rain_grabs_total rate_limited = %v, want %d", got[`rain_grabs_total{status="rate_limited"}`], botLimited+8)
	}
}

// TestRateLimitedBeforeTheBody: a client over its per-IP rate is answered
// 429 before its body is read, even when the body never comes.
func TestRateLimitedBeforeTheBody(t *testing.T) {
	s := newStack(t, 1, redistest.Options{}, func(cfg *Config) {
		cfg.IPLimit = limit.New(limit.Config{Rate: 0.001, Burst: 1})
	})
	if r := s.grab(t, "p", "u"); r.Code != 404 {
		t.Fatalf("first grab = %d %v, want 404 (no pool), within the rate", r.Code, r.Body)
	}
	if code := s.withheldBody(t, ""); code != 429 {
		t.Fatalf("over the rate with a body that never comes = %d, want 429", code)
	}
}

// TestIPKey: one key per IPv4 address and per IPv6 /64, whatever the
// spelling; not an address: no key.
func TestIPKey(t *testing.T) {
	for _, c := range []struct{ in, key string }{
		{"203.0.113.7", "203.0.113.7"},
		{"203.0.113.7:5555", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"[::ffff:203.0.113.7]:80", "203.0.113.7"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{"2001:DB8:1:2::9", "2001:db8:1:2::/64"},
		{"2001:0db8:0001:0002::1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2::1]:443", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{"", ""},
		{"unknown", ""},
		{"203.0.113.07", ""},
		{"203.0.113.7, 198.51.100.1", ""},
	} {
		key, ok := ipKey(c.in)
		if key != c.key || ok != (c.key != "") {
			t.Errorf("ipKey(%q) = %q, %v; want %q", c.in, key, ok, c.key)
		}
	}
}

// FuzzIPKey: any header value gives no key or a canonical one: an IPv4
// address or an IPv6 /64 that is its own key again.
func FuzzIPKey(f *testing.F) {
	for _, s := range []string{"203.0.113.7", "[::1]:80", "2001:db8::1", "fe80::1%eth0", "::ffff:1.2.3.4", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		key, ok := ipKey(s)
		if !ok {
			return
		}
		if p, err := netip.ParsePrefix(key); err == nil {
			if p.Bits() != 64 || p != p.Masked() || !p.Addr().Is6() || p.Addr().Is4In6() {
				t.Fatalf("ipKey(%q) = %q: not an IPv6 /64", s, key)
			}
			return
		}
		if a, err := netip.ParseAddr(key); err != nil || !a.Is4() {
			t.Fatalf("ipKey(%q) = %q: neither IPv4 nor an IPv6 /64", s, key)
		}
		if again, ok := ipKey(key); !ok || again != key {
			t.Fatalf("ipKey(%q) = %q, but ipKey(%q) = %q", s, key, key, again)
		}
	})
}
