package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"rain"
	"rain/internal/catalog"
	"rain/internal/grab"
	"rain/internal/instance"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// TestOneBadShard: four shards, two rain instances (the grab service, the
// worker pool and the HTTP API, as rain serve wires them) under 1,500
// grabs/s; one shard of the four is killed (-9) and restarted, frozen
// (SIGSTOP) and thawed, slowed (a proxy holds each of its replies half as
// long again as the budget), and kept busy by a slow script. For each fault the
// test measures, and prints: the p99 of users whose home is on a healthy
// shard, beside the same before the fault; how fast users of the bad shard
// are answered 503 once its breaker is open; how long /readyz takes and how
// soon it says 503; how soon grabs on the bad shard succeed again after it
// is back. Then the money: the audit is ok and every grant answered is the
// user's one grant.
//
// CI runs it short, with the race detector, and checks the figures with
// room for that; RAIN_CHAOS=full runs longer windows and checks the
// figures of the issue as they are (scripts/chaos.sh).
func TestOneBadShard(t *testing.T) {
	full := os.Getenv("RAIN_CHAOS") == "full"
	// CI: short windows, latency limits ×8 (400 ms where the figure is
	// 50 ms: under the 500 ms budget, so a user who waited on the bad shard
	// still fails the test, while a loaded machine, every package's tests
	// at once and the other core busy, passes it; the slow script burns a
	// core of its own). The healthy users' p99 may reach 3x its calm figure
	// on a machine loaded enough that the calm one is near the limit, but
	// never the budget less 20 ms.
	window, slack := 2*time.Second, 8.0
	if full {
		window, slack = 10*time.Second, 1.0
	}
	const rate = 1500
	ctx := context.Background()
	servers := redistest.StartN(t, 4, durable)
	specs := shardtest.Specs(redistest.Addrs(servers))
	const subPools = 4
	// The bad shard: one that is neither the serial shard nor the arbiter,
	// the first of the pool's placement that is not s1. Its instances reach
	// it through a proxy, which answers it late in the slow fault.
	ring, err := shard.NewRing(specs, 0)
	if err != nil {
		t.Fatal(err)
	}
	placed := ring.Distinct("bad", subPools)
	badSub := slices.IndexFunc(placed, func(name string) bool { return name != "s1" })
	badName := placed[badSub]
	badAt := slices.IndexFunc(specs, func(sp shard.Spec) bool { return sp.Name == badName })
	bad := servers[badAt]
	late := redisproxy.Start(t, bad.Addr)
	specs[badAt].Addr = late.Addr
	var urls []string
	var instances []*instance.Instance
	for range 2 {
		in, base := startInstance(t, specs, nil)
		urls = append(urls, base)
		instances = append(instances, in)
	}
	st, _, err := instances[0].Catalog.Preload(ctx, rain.Spec{PoolID: "bad", TotalCents: 100_000_000, Count: 1_000_000, SubPools: subPools})
	if err != nil {
		t.Fatal(err)
	}
	if st.SubPools[badSub].Shard != badName {
		t.Fatalf("sub-pool %d placed on %s, want %s (the ring's placement)", badSub, st.SubPools[badSub].Shard, badName)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	l := &loader{client: client, urls: urls, badSub: badSub, subPools: subPools}
	// Each sub-pool's server (its index in servers), for the fsyncs that
	// may excuse its users.
	homes := make([]int, subPools)
	for j, sp := range st.SubPools {
		homes[j] = slices.IndexFunc(specs, func(s shard.Spec) bool { return s.Name == sp.Shard })
	}

	type fault struct {
		name        string
		start, stop func()
		stalls      bool // the shard stops answering (else it only works harder)
	}
	var slow chan struct{} // closed when the slow script has returned
	var audits chan error  // the audits' end
	// The big pool lives on the bad shard alone: an id the ring places there.
	// Its audits read the shards directly: their pages' replies are the
	// shard's work, not the slow fault's proxy's (which parses every reply).
	auditor := catalog.New(shardtest.Open(t, redistest.Addrs(servers), shard.Options{}), catalog.Config{})
	bigID := ""
	for i := 0; bigID == ""; i++ {
		if id := fmt.Sprintf("big%d", i); ring.Distinct(id, 1)[0] == badName {
			bigID = id
		}
	}
	if _, _, err := instances[0].Catalog.Preload(ctx, rain.Spec{PoolID: bigID, TotalCents: 300_000, Count: 300_000, SubPools: 1}); err != nil {
		t.Fatal(err)
	}
	faults := []fault{
		{"kill -9, restart", bad.Kill, bad.Restart, true},
		{"SIGSTOP, SIGCONT", bad.Pause, bad.Resume, true},
		// A shard that answers, but every command later than the budget
		// (half as long again): to rain a stall, cut off as one.
		{"answers past the budget", func() {
			late.SetReplyDelay(func([]string) bool { return true }, instances[0].Shards.Timeout()*3/2)
		}, func() { late.SetReplyDelay(nil, 0) }, true},
		{"a slow script", func() {
			slow = make(chan struct{})
			c := shard.NewClient(bad.Addr, shard.Options{Timeout: time.Minute})
			// A shard's core is its own in production; here the shards,
			// both instances and the load share two with every other
			// package's tests. At the lowest priority the script's spin
			// takes only a core nobody else wants: the shard still answers
			// nothing for the window, and the healthy users' figures
			// measure rain, not a core this machine lost to the fault.
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, bad.PID(), 19); err != nil {
				t.Logf("the busy shard's priority not lowered: %v", err)
			}
			go func() {
				defer close(slow)
				defer c.Close()
				// Busy for the window, on the shard's one thread.
				_ = c.Eval(ctx, `local t = redis.call('TIME') local s = tonumber(t[1])
					while tonumber(redis.call('TIME')[1]) - s < tonumber(ARGV[1]) do end return 1`, nil, int(window.Seconds())).Err()
			}()
		}, func() {
			<-slow
			// Back to the priority of the others for the faults after it
			// (raising it needs CAP_SYS_NICE: the suite runs as root, as
			// scripts/test.sh does to install Redis).
			if err := syscall.Setpriority(syscall.PRIO_PROCESS, bad.PID(), 0); err != nil {
				t.Logf("the busy shard's priority not restored: %v", err)
			}
		}, true},
		{"audits of a 300,000-packet pool", func() {
			audits = make(chan error, 1)
			go func() {
				var err error
				for end := time.Now().Add(window); err == nil && time.Now().Before(end); {
					_, err = auditor.Audit(ctx, bigID)
				}
				audits <- err
			}()
		}, func() {
			if err := <-audits; err != nil {
				t.Errorf("audit of the big pool: %v", err)
			}
		}, false},
	}
	l.start(rate)
	defer l.stop()
	time.Sleep(window) // the no-fault figures
	calm := l.cut()
	healthyCalm := calm.p99(false, true)
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			l.cut()
			fsyncs := watchFsyncs(t, servers) // set again each time: a restart forgets it
			fsyncs()
			began := time.Now()
			f.start()
			opened := watchOpen(instances, badName)
			ready := probeReady(t, client, urls[0], window)
			time.Sleep(window - time.Since(began))
			during := l.cut()
			f.stop()
			back := time.Now()
			recovered := l.until(func(r result) bool { return r.bad && r.code == 200 && r.at.After(back) }, 20*time.Second)
			// The next fault starts once every instance's breakers have
			// closed (one instance serving again does not mean the other
			// does: its probe may still be out).
			defer waittest.Until(t, 10*time.Second, "every instance's breakers closed", func() bool {
				for _, in := range instances {
					for _, st := range in.Grabs.ShardStats() {
						if st.Breaker != 0 {
							return false
						}
					}
				}
				return true
			})
			// A healthy shard whose own fsync landed past the budget may be
			// cut off (invariant 10): its users are left out of the healthy
			// figures. Nothing else excuses a failure of theirs.
			bySrv := fsyncs()
			slow := make([]time.Duration, subPools) // by sub-pool
			for j := range slow {
				slow[j] = bySrv[homes[j]]
			}
			budget := instances[0].Shards.Timeout()
			excused := func(r result) bool { return !r.bad && slow[r.home] >= budget }
			for j := range subPools {
				if j != badSub && slow[j] >= budget {
					t.Logf("sub-pool %d's users left out: the fsync of its shard %s took %v, past the budget of %v", j, st.SubPools[j].Shard, slow[j], budget)
				}
			}
			counted := during.without(excused)
			healthy := counted.p99(false, true)
			if n, of, first := counted.failed(false); n > 0 {
				t.Errorf("%d of %d grabs of users on healthy shards failed, the first: %s; the slowest fsync of each sub-pool's shard %v; the shards as instance 0 sees them %+v",
					n, of, first, slow, instances[0].Grabs.ShardStats())
			}
			// Once its breaker is open on every instance (and a second into
			// the fault at the earliest): the grabs sent before it may have
			// waited on the shard for the budget, and on a loaded machine
			// the first batch's timeout, which opens it, comes late.
			from, openAfter := began.Add(time.Second), time.Duration(-1) // -1: never seen open
			if openAt := opened(); !openAt.IsZero() {
				openAfter = openAt.Sub(began)
				if openAt.After(from) {
					from = openAt
				}
			}
			shedBad := during.sentAfter(from).p99(true, false)
			t.Logf("%s: healthy users' p99 %v (%v without the fault); bad shard's 503s p99 %v (of those sent %v into the fault or later; its breaker open on every instance after %v); /readyz slowest %v, 503 after %v; grabs on the bad shard back %v after it",
				f.name, healthy, healthyCalm, shedBad, from.Sub(began), openAfter, ready.slowest, ready.firstDown, recovered)
			limit := func(d time.Duration) time.Duration { return time.Duration(float64(d) * slack) }
			// CI: a machine loaded enough that the calm p99 is already a
			// good part of the limit gets up to 3x it, but never as much as
			// the budget less 20 ms: a healthy user who waited on the bad
			// shard waits the budget, and still fails the test.
			healthyLimit := max(2*healthyCalm, limit(50*time.Millisecond))
			if !full {
				healthyLimit = max(healthyLimit, min(3*healthyCalm, budget-20*time.Millisecond))
			}
			if healthy > healthyLimit {
				t.Errorf("healthy users' p99 %v under the fault, want at most %v (2x %v and %v, or on a loaded machine up to 3x, below the budget)",
					healthy, healthyLimit, healthyCalm, limit(50*time.Millisecond))
			}
			if !f.stalls {
				// A busy shard whose own fsync landed past the budget may be
				// cut off (invariant 10); nothing else excuses a refusal.
				if n, of, first := during.failed(true); n > 0 {
					if slow[badSub] >= budget {
						t.Logf("%d of %d grabs on the busy shard failed, the first: %s; its fsync took %v, past the budget", n, of, first, slow[badSub])
					} else {
						t.Errorf("%d of %d grabs on the busy shard failed, the first: %s (its slowest fsync %v)", n, of, first, slow[badSub])
					}
				}
				// The same allowance as the healthy users' on a loaded
				// machine (CI): up to 3x the calm p99, below the budget, so
				// that a busy shard that stalls its grabs still fails.
				calmBad := calm.p99(true, true)
				busyLimit := max(2*calmBad, limit(50*time.Millisecond))
				if !full {
					busyLimit = max(busyLimit, min(3*calmBad, budget-20*time.Millisecond))
				}
				if bad := during.p99(true, true); bad > busyLimit {
					t.Errorf("the busy shard's users' p99 %v, want at most %v (2x %v and %v, or on a loaded machine up to 3x, below the budget)",
						bad, busyLimit, calmBad, limit(50*time.Millisecond))
				}
				return
			}
			if shedBad > limit(50*time.Millisecond) {
				t.Errorf("bad shard's users answered in p99 %v once its breaker is open, want at most %v", shedBad, limit(50*time.Millisecond))
			}
			if ready.slowest > time.Second {
				t.Errorf("/readyz took %v under the fault, want at most 1s", ready.slowest)
			}
			if ready.firstDown < 0 || ready.firstDown > limit(2*time.Second) {
				t.Errorf("/readyz said 503 after %v, want within %v", ready.firstDown, limit(2*time.Second))
			}
			if recovered < 0 || recovered > limit(2*time.Second) {
				t.Errorf("grabs on the bad shard back %v after it, want within %v", recovered, limit(2*time.Second))
			}
		})
	}
	l.stop()

	// The money: every grant answered is the user's one grant, and the
	// audit is ok.
	answered := l.granted()
	for u, r := range answered {
		again, err := instances[1].Grabs.Grab(ctx, "bad", u)
		if err != nil || again.Outcome != grab.AlreadyGranted || again.Serial != r.Serial || again.Amount != r.Amount {
			t.Fatalf("re-grab of %s = %+v, %v; want already_granted %+v", u, again, err, r)
		}
	}
	rep, err := instances[0].Catalog.Audit(ctx, "bad")
	if err != nil || !rep.OK {
		t.Fatalf("audit after the faults = %+v, %v", rep, err)
	}
	t.Logf("%d grants answered, each the user's one; audit ok", len(answered))
}

// result is one grab as the loader saw it.
type result struct {
	at      time.Time // when it was answered
	latency time.Duration
	code    int
	home    int  // the user's home sub-pool
	bad     bool // the user's home is on the bad shard
	user    string
	grant   grab.Result
	err     string // the answer's error, or the transport's
}

// results is a slice of results with figures.
type results []result

func (rs results) p99(bad, ok bool) time.Duration {
	var ds []time.Duration
	for _, r := range rs {
		if r.bad == bad && (r.code == 200) == ok {
			ds = append(ds, r.latency)
		}
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}

// failed counts the answers other than 200 of users on the bad shard (bad)
// or on the others.
func (rs results) failed(bad bool) (n, of int, first string) {
	for _, r := range rs {
		if r.bad == bad {
			of++
			if r.code != 200 {
				if n++; n == 1 {
					first = fmt.Sprintf("%d %s", r.code, r.err)
				}
			}
		}
	}
	return n, of, first
}

// without is rs less the results that match.
func (rs results) without(match func(result) bool) results {
	var out results
	for _, r := range rs {
		if !match(r) {
			out = append(out, r)
		}
	}
	return out
}

// sentAfter is the results of the grabs sent after t (answered, less their
// latency).
func (rs results) sentAfter(t time.Time) results {
	var out results
	for _, r := range rs {
		if r.at.Add(-r.latency).After(t) {
			out = append(out, r)
		}
	}
	return out
}

// watchOpen watches the breaker of shard name on every instance until it
// has been seen open (or probing) on all of them at once, or for 10 s; the
// function it returns stops the watch and says when that was (zero: not
// seen).
func watchOpen(instances []*instance.Instance, name string) func() time.Time {
	var at time.Time
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
			all := true
			for _, in := range instances {
				open := false
				for _, st := range in.Grabs.ShardStats() {
					open = open || (st.Name == name && st.Breaker != 0)
				}
				all = all && open
			}
			if all {
				at = time.Now()
				return
			}
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	return func() time.Time {
		close(stop)
		<-done
		return at
	}
}

// loader sends grabs at a fixed rate, each from a new user, alternating
// between the instances, and keeps what came back.
type loader struct {
	client      *http.Client
	urls        []string
	badSub      int
	subPools    int
	stopOnce    sync.Once
	stopC       chan struct{}
	wg          sync.WaitGroup
	mu          sync.Mutex // guards the fields below
	window, all results
	seq         int
}

func (l *loader) start(rate int) {
	l.stopC = make(chan struct{})
	l.wg.Go(func() {
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		sem := make(chan struct{}, 1000)
		var inflight sync.WaitGroup
		defer inflight.Wait()
		for {
			select {
			case <-l.stopC:
				return
			case <-tick.C:
			}
			select {
			case sem <- struct{}{}:
			default:
				continue // too many in flight: the client would queue; drop it
			}
			l.mu.Lock()
			l.seq++
			n := l.seq
			l.mu.Unlock()
			inflight.Go(func() {
				defer func() { <-sem }()
				l.one(n)
			})
		}
	})
}

func (l *loader) one(n int) {
	user := fmt.Sprintf("u%d", n)
	body := fmt.Sprintf(`{"pool_id":"bad","user_id":%q}`, user)
	start := time.Now()
	resp, err := l.client.Post(l.urls[n%len(l.urls)]+"/grab", "application/json", strings.NewReader(body))
	home := int(xxhash.Sum64String(user) % uint64(l.subPools))
	r := result{user: user, home: home, bad: home == l.badSub}
	if err == nil {
		r.code = resp.StatusCode
		var g struct {
			Amount int64  `json:"amount_cents"`
			Serial int64  `json:"serial"`
			Error  string `json:"error"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&g)
		resp.Body.Close()
		r.grant = grab.Result{Outcome: grab.Granted, Amount: g.Amount, Serial: g.Serial}
		r.err = g.Error
	} else {
		r.err = err.Error()
	}
	r.at = time.Now()
	r.latency = r.at.Sub(start)
	l.mu.Lock()
	l.window = append(l.window, r)
	l.all = append(l.all, r)
	l.mu.Unlock()
}

// cut returns the results since the last cut.
func (l *loader) cut() results {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.window
	l.window = nil
	return w
}

// until waits for a result that matches and returns how long after now it
// came; -1 if none within d.
func (l *loader) until(match func(result) bool, d time.Duration) time.Duration {
	begin := time.Now()
	for time.Since(begin) < d {
		l.mu.Lock()
		for _, r := range l.all {
			if match(r) {
				l.mu.Unlock()
				return r.at.Sub(begin)
			}
		}
		l.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	return -1
}

func (l *loader) stop() {
	l.stopOnce.Do(func() { close(l.stopC) })
	l.wg.Wait()
}

// granted is every grant answered 200, by user.
func (l *loader) granted() map[string]grab.Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]grab.Result{}
	for _, r := range l.all {
		if r.code == 200 {
			out[r.user] = r.grant
		}
	}
	return out
}

// readiness is what probing /readyz during a fault saw.
type readiness struct {
	slowest   time.Duration // the longest /readyz took
	firstDown time.Duration // when it first said 503, after the fault began; -1 never
}

// probeReady asks /readyz every 100 ms for d.
func probeReady(t *testing.T, c *http.Client, url string, d time.Duration) readiness {
	t.Helper()
	rd := readiness{firstDown: -1}
	begin := time.Now()
	for time.Since(begin) < d {
		start := time.Now()
		resp, err := c.Get(url + "/readyz")
		took := time.Since(start)
		rd.slowest = max(rd.slowest, took)
		if err == nil {
			if resp.StatusCode == http.StatusServiceUnavailable && rd.firstDown < 0 {
				rd.firstDown = time.Since(begin)
			}
			resp.Body.Close()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return rd
}
