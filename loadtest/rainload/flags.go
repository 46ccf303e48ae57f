package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"rain"
	"rain/loadtest/rainload/internal/schedule"
)

// config is a load test as the flags describe it, checked.
type config struct {
	base        *url.URL // -url; http only
	addr        string   // host:port to dial
	pool        string
	startRate   float64
	stages      []schedule.Stage // a constant -rate is one stage
	users       int64
	userPrefix  string
	repeat      float64
	maxInflight int
	conns       int
	timeout     time.Duration
	summary     string
	timeline    string
	progress    time.Duration
	adminToken  string
	scrape      bool
	metricsURL  string // -metrics-url; "" is -url's /metrics
	preload     bool
	preloadN    int64        // packets
	preloadSum  int64        // cents
	signer      *tokenSigner // -user-secret; nil: no user tokens
}

// parseLoad reads the flags of a load test. Errors say which flag is wrong; -h
// prints the flags and returns flag.ErrHelp.
func parseLoad(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("rainload run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rawURL := fs.String("url", "http://127.0.0.1:8080", "base `URL` of the target (http only); the driver POSTs {url}/grab")
	pool := fs.String("pool", "", "pool `id` to grab from (required; "+rain.IDRule+")")
	rate := fs.Float64("rate", 0, "constant arrival `rate` in requests per second, with -duration (or use -stages)")
	duration := fs.Duration("duration", 0, "length of a constant -rate load")
	stages := fs.String("stages", "", "ramping arrival rate: comma-separated `DURATION:RATE` stages, each ramping linearly to RATE over DURATION from where the last ended, e.g. 5s:1000,10s:8000,5s:8000,5s:0 (instead of -rate and -duration)")
	startRate := fs.Float64("start-rate", 0, "arrival `rate` at which -stages start")
	users := fs.Int64("users", 10_000_000, "size of the user-id space: new users are PREFIX0, PREFIX1, ... up to PREFIX(users-1), then around again")
	prefix := fs.String("user-prefix", "u", "user id `prefix`; give each run its own to meet only new users")
	repeat := fs.Float64("repeat", 0.2, "`share` of requests, in [0, 1], that reuse a user id already sent (retries and double taps)")
	maxInflight := fs.Int("max-inflight", 10_000, "virtual users: at most `N` requests in flight; an arrival that finds N in flight is dropped and counted")
	conns := fs.Int("conns", 256, "at most `N` keep-alive TCP connections; requests in flight beyond that wait for one (the wait counts in their latency)")
	timeout := fs.Duration("timeout", 5*time.Second, "a request not answered this long after it was due (waiting for a connection included) fails as a transport error; the end of the run waits as long for requests in flight")
	summary := fs.String("summary", "", "write the run's JSON summary to `FILE`")
	timeline := fs.String("timeline", "", "write one JSON line per second of the run to `FILE`")
	progress := fs.Duration("progress", time.Second, "print a progress line on stderr this often, rounded up to whole seconds; 0 for none")
	token := fs.String("admin-token", "", "bearer `token` for -preload and -scrape")
	scrape := fs.Bool("scrape", false, "every second, GET /metrics (rain_pool_* gauges) and GET /admin/pools/{pool} (remaining stock) into the timeline; needs -admin-token")
	metricsURL := fs.String("metrics-url", "", "the `URL` -scrape reads the gauges from (default: {url}/metrics; give http://ADDR/metrics for a rain serve --metrics-listen ADDR)")
	preload := fs.String("preload", "", "POST /admin/pools with `COUNT:TOTAL_CENTS` before the load (201 or 200 are fine); needs -admin-token")
	userSecret := fs.String("user-secret", "", "send each grab with a user token (Authorization: Bearer, HS256, sub = its user id) signed with the secret in `FILE`, for a rain serve --user-auth hs256:FILE")
	userAud := fs.String("user-audience", "", "the aud of the user tokens (rain serve --user-auth-audience)")
	userIss := fs.String("user-issuer", "", "the iss of the user tokens (rain serve --user-auth-issuer)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	c := &config{
		pool: *pool, startRate: *startRate, users: *users, userPrefix: *prefix, repeat: *repeat,
		maxInflight: *maxInflight, conns: *conns, timeout: *timeout, summary: *summary,
		timeline: *timeline, progress: *progress, adminToken: *token, scrape: *scrape, metricsURL: *metricsURL,
	}
	if c.metricsURL != "" {
		if mu, err := url.Parse(c.metricsURL); err != nil || mu.Scheme != "http" || mu.Host == "" {
			return nil, fmt.Errorf("-metrics-url %q: want http://HOST[:PORT]/PATH", c.metricsURL)
		}
		if !c.scrape {
			return nil, errors.New("-metrics-url goes with -scrape")
		}
	}
	if err := c.target(*rawURL); err != nil {
		return nil, err
	}
	if err := c.schedule(*stages, *rate, *duration, set); err != nil {
		return nil, err
	}
	if err := c.bounds(); err != nil {
		return nil, err
	}
	if err := c.preloadSpec(*preload); err != nil {
		return nil, err
	}
	if err := c.userTokens(*userSecret, *userAud, *userIss); err != nil {
		return nil, err
	}
	return c, nil
}

// target checks -url and -pool.
func (c *config) target(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("-url: %w", err)
	}
	if u.Scheme != "http" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("-url %q: want http://HOST[:PORT][/PATH]", rawURL)
	}
	c.base, c.addr = u, u.Host
	if u.Port() == "" {
		c.addr = u.Host + ":80"
	}
	// Ids are checked once here, so that the hot path can put them into
	// JSON without escaping.
	return rain.CheckID("-pool", c.pool)
}

// schedule sets the arrival schedule: -stages, or -rate and -duration.
func (c *config) schedule(stages string, rate float64, duration time.Duration, set map[string]bool) error {
	var err error
	switch {
	case stages != "" && (set["rate"] || set["duration"]):
		return errors.New("give -rate and -duration, or -stages, not both")
	case stages != "":
		if c.stages, err = schedule.Parse(stages); err != nil {
			return fmt.Errorf("-stages: %w", err)
		}
		if _, err := schedule.New(c.startRate, c.stages); err != nil {
			return fmt.Errorf("-stages: %w", err)
		}
	case set["start-rate"]:
		return errors.New("-start-rate goes with -stages")
	default:
		if !(rate > 0) || math.IsInf(rate, 0) || duration <= 0 {
			return errors.New("give -rate > 0 and -duration > 0, or -stages")
		}
		c.startRate = rate
		c.stages = []schedule.Stage{{Duration: duration, Target: rate}}
	}
	return nil
}

// bounds checks the users, the repeats, the in-flight and connection
// bounds, the timeout and the progress interval.
func (c *config) bounds() error {
	if c.users < 1 {
		return fmt.Errorf("-users %d: want >= 1", c.users)
	}
	if c.userPrefix == "" || !rain.ValidID(c.userPrefix+strconv.FormatInt(c.users-1, 10)) {
		return fmt.Errorf("-user-prefix %q with -users %d: user ids must be %s", c.userPrefix, c.users, rain.IDRule)
	}
	if !(c.repeat >= 0 && c.repeat <= 1) {
		return fmt.Errorf("-repeat %v: want a share in [0, 1]", c.repeat)
	}
	if c.maxInflight < 1 {
		return fmt.Errorf("-max-inflight %d: want >= 1", c.maxInflight)
	}
	if c.conns < 1 {
		return fmt.Errorf("-conns %d: want >= 1", c.conns)
	}
	c.conns = min(c.conns, c.maxInflight) // more could never be busy
	if c.timeout <= 0 {
		return fmt.Errorf("-timeout %v: want > 0", c.timeout)
	}
	if c.progress < 0 {
		return fmt.Errorf("-progress %v: want >= 0", c.progress)
	}
	return nil
}

// preloadSpec reads -preload COUNT:TOTAL_CENTS.
func (c *config) preloadSpec(preload string) error {
	if preload != "" {
		n, sum, ok := strings.Cut(preload, ":")
		var err error
		c.preloadN, err = strconv.ParseInt(n, 10, 64)
		if err == nil {
			c.preloadSum, err = strconv.ParseInt(sum, 10, 64)
		}
		if !ok || err != nil || c.preloadN < 1 || c.preloadSum < 1 {
			return fmt.Errorf("-preload %q: want COUNT:TOTAL_CENTS, both > 0", preload)
		}
		c.preload = true
	}
	if (c.preload || c.scrape) && c.adminToken == "" {
		return errors.New("-preload and -scrape need -admin-token")
	}
	return nil
}

// userTokens sets the signer of -user-secret.
func (c *config) userTokens(secret, aud, iss string) error {
	switch {
	case secret != "":
		// The tokens outlive the run, its last answers and some slack.
		var length time.Duration
		for _, st := range c.stages {
			length += st.Duration
		}
		expires := time.Now().Add(length + c.timeout + 10*time.Minute)
		var err error
		c.signer, err = newTokenSigner(secret, aud, iss, expires)
		return err
	case aud != "" || iss != "":
		return errors.New("-user-audience and -user-issuer go with -user-secret")
	}
	return nil
}
