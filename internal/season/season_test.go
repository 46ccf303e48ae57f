package season

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"rain/internal/pgtest"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
)

// topology is the compose file's, as processes on loopback.
type topology struct {
	shards   []*redistest.Server
	clients  []redis.UniversalClient // one per shard, the test's own
	pg       *pgtest.Server
	pgURL    string
	serves   []*proc
	settle   *proc
	token    string
	users    *users
	keysThen []map[string]bool // each shard's keys before the first pool
}

func startTopology(t *testing.T) *topology {
	t.Helper()
	bin := rainBinary(t)
	tp := &topology{}
	tp.shards = redistest.StartN(t, 3, redistest.Options{AOF: true, Fsync: "always"})
	tp.clients = redistest.Clients(t, tp.shards)
	tp.pg = pgtest.Start(t, pgtest.Options{Durable: true})
	tp.pgURL = tp.pg.NewDB(t)
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	tp.token = hex.EncodeToString(b)
	env := []string{"RAIN_REDIS=" + shardtest.Flag(redistest.Addrs(tp.shards)), "RAIN_POSTGRES=" + tp.pgURL, "RAIN_ADMIN_TOKEN=" + tp.token,
		"RAIN_USER_AUTH=none", // the users are made up, as in docker-compose.yml
		"RAIN_LOG_LEVEL=info", "PATH=" + os.Getenv("PATH")}
	for i := range 2 {
		tp.serves = append(tp.serves, startProc(t, fmt.Sprintf("rain-%d", i+1), bin, env,
			"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0"))
	}
	tp.settle = startProc(t, "settle", bin, env, "settle", "--listen", "127.0.0.1:0", "--consumer", "settle-1",
		"--claim-after", "5s")
	tp.users = newUsers(tp.serves)
	tp.keysThen = tp.keys(t)
	return tp
}

// keys is every key of each shard.
func (tp *topology) keys(t *testing.T) []map[string]bool {
	t.Helper()
	var out []map[string]bool
	for _, c := range tp.clients {
		ks, err := c.Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, k := range ks {
			m[k] = true
		}
		out = append(out, m)
	}
	return out
}

// poolPlan is one pool of the season: its spec and how its life goes.
type poolPlan struct {
	id        string
	count     int64
	users     int           // users who grab (some twice)
	window    time.Duration // from its preload to its end
	endByHand bool          // ended by POST .../end at the window's end (else its ends_at passes)
}

// account is a closed pool's account, as GET /admin/pools/{id} answers it.
type account struct {
	State          string `json:"state"`
	PreloadedCount int64  `json:"preloaded_count"`
	PreloadedCents int64  `json:"preloaded_cents"`
	ConfirmedCount int64  `json:"confirmed_count"`
	ConfirmedCents int64  `json:"confirmed_cents"`
	UnclaimedCount int64  `json:"unclaimed_count"`
	UnclaimedCents int64  `json:"unclaimed_cents"`
}

// live runs one pool's life: preload, its users, its end, its close once
// every user has an answer. It returns the close's account.
func (tp *topology) live(t *testing.T, ctx context.Context, p poolPlan) {
	ends := time.Now().Add(p.window)
	endsAt := ends
	if p.endByHand {
		endsAt = ends.Add(time.Hour)
	}
	spec := fmt.Sprintf(`{"pool_id":%q,"total_cents":%d,"count":%d,"sub_pools":3,"hold_seconds":300,"ends_at":%q}`,
		p.id, p.count*100, p.count, endsAt.UTC().Format(time.RFC3339Nano))
	if code, b := tp.users.admin(ctx, "POST", "/admin/pools", tp.token, spec); code != 201 && code != 200 {
		t.Errorf("preload of %s = %d %s", p.id, code, b)
		return
	}
	var wg sync.WaitGroup
	pace := time.Duration(int64(p.window) * 8 / 10 / int64(p.users))
	for u := range p.users {
		user := fmt.Sprintf("u%d", u)
		wg.Go(func() {
			tp.users.grab(ctx, p.id, user)
			if u%10 == 0 { // a user who grabs again is answered the same grant
				tp.users.grab(ctx, p.id, user)
			}
		})
		time.Sleep(pace)
	}
	wg.Wait()
	time.Sleep(time.Until(ends))
	if p.endByHand {
		if code, b := tp.users.admin(ctx, "POST", "/admin/pools/"+p.id+"/end", tp.token, ""); code != 200 {
			t.Errorf("end of %s = %d %s", p.id, code, b)
			return
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, b := tp.users.admin(ctx, "POST", "/admin/pools/"+p.id+"/close", tp.token, "")
		if code == 200 {
			return
		}
		if code != 409 || time.Now().After(deadline) {
			t.Errorf("close of %s = %d %s", p.id, code, b)
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// TestSeasonDeployed: pools whose windows overlap (preloads while others
// are live, ends, closes, preloads after closes on the same shards) on the
// compose topology, through one rain settle that lives the whole test,
// while a rain serve, rain settle, a shard and PostgreSQL are each killed
// (-9) and restarted. At the end every pool is closed with an exact
// account, PostgreSQL holds exactly the grants the users were told (each
// once, with its amount), and each shard holds what it held before but
// the pools' records, the registry and the sub-pools' tombstones.
//
// With RAIN_SOAK=DURATION (scripts/soak.sh) the season goes on for that
// long, a fault each round, and a line every 30 s gives each process's
// memory and the grabs' p99.
func TestSeasonDeployed(t *testing.T) {
	soak, _ := time.ParseDuration(os.Getenv("RAIN_SOAK"))
	tp := startTopology(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var plans []poolPlan
	var wg sync.WaitGroup
	began := time.Now()
	stopReport := tp.report(t, soak)
	for round := 0; round == 0 || time.Since(began) < soak; round++ {
		faults := tp.faults(t, round, soak > 0)
		for i := range 12 {
			p := poolPlan{id: fmt.Sprintf("r%dp%d", round, i), count: 400, users: 150, window: 6 * time.Second, endByHand: i%2 == 1}
			if i%3 == 0 {
				p.count = 100 // sold out: spills, then sold_out
			}
			plans = append(plans, p)
			wg.Go(func() { tp.live(t, ctx, p) })
			time.Sleep(4 * time.Second)
		}
		faults.Wait()
	}
	wg.Wait()
	stopReport()
	if t.Failed() {
		return
	}
	tp.check(t, plans)
}

// faults kills and restarts one process of each kind in turn during a
// round (in a soak, one kind a round): a serve instance, settle, a shard
// (not the serial one), PostgreSQL.
func (tp *topology) faults(t *testing.T, round int, soak bool) *sync.WaitGroup {
	kinds := []struct {
		name string
		kill func()
		back func()
	}{
		{"rain serve", tp.serves[1].kill, tp.serves[1].start},
		{"rain settle", tp.settle.kill, tp.settle.start},
		{"a shard", tp.shards[2].Kill, tp.shards[2].Restart},
		{"PostgreSQL", tp.pg.Kill, tp.pg.Restart},
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, k := range kinds {
			if soak && i != round%len(kinds) {
				continue
			}
			time.Sleep(9 * time.Second)
			t.Logf("%s: kill -9 %s", time.Now().Format("15:04:05.000"), k.name)
			k.kill()
			time.Sleep(2 * time.Second)
			k.back()
			t.Logf("%s: %s back", time.Now().Format("15:04:05.000"), k.name)
		}
	})
	return &wg
}

// check compares what is left with what the users were told.
func (tp *topology) check(t *testing.T, plans []poolPlan) {
	ctx := context.Background()
	u := tp.users
	if len(u.problems) > 0 {
		t.Fatalf("%d answers broke a rule; the first: %s", len(u.problems), u.problems[0])
	}
	t.Logf("answers: %v", u.answers)
	for _, p := range plans {
		code, b := u.admin(ctx, "GET", "/admin/pools/"+p.id, tp.token, "")
		var a account
		if err := json.Unmarshal(b, &a); code != 200 || err != nil {
			t.Fatalf("status of %s = %d %s", p.id, code, b)
		}
		var count, cents int64
		for _, g := range u.granted(p.id) {
			count, cents = count+1, cents+g.Amount
		}
		if a.State != "closed" || a.PreloadedCount != p.count || a.PreloadedCents != p.count*100 ||
			a.ConfirmedCount != count || a.ConfirmedCents != cents ||
			a.UnclaimedCount != p.count-count || a.UnclaimedCents != p.count*100-cents {
			t.Errorf("account of %s: %+v; the users were told %d grants, %d cents, of %d packets", p.id, a, count, cents, p.count)
		}
	}
	conn, err := pgx.Connect(ctx, tp.pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT serial, pool_id, user_id, amount_cents FROM rain_grants")
	if err != nil {
		t.Fatal(err)
	}
	inDB := map[int64]grant{}
	for rows.Next() {
		var g grant
		if err := rows.Scan(&g.Serial, &g.Pool, &g.User, &g.Amount); err != nil {
			t.Fatal(err)
		}
		inDB[g.Serial] = g
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	told := u.granted("")
	for s, g := range told {
		if inDB[s] != g {
			t.Errorf("serial %d: the user was told %+v; PostgreSQL holds %+v", s, g, inDB[s])
		}
	}
	for s, g := range inDB {
		if _, ok := told[s]; !ok {
			t.Errorf("PostgreSQL holds %+v, which no user was told", g)
		}
	}
	var closed int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM rain_pools").Scan(&closed); err != nil || closed != len(plans) {
		t.Errorf("rain_pools holds %d accounts (%v); want %d", closed, err, len(plans))
	}
	tp.checkKeys(t, plans)
	t.Logf("%d pools, %d grants told and in PostgreSQL once each", len(plans), len(told))
}

// checkKeys: each shard holds what it held before the first pool, and of
// the pools only their records, the registry and the tombstones.
func (tp *topology) checkKeys(t *testing.T, plans []poolPlan) {
	ctx := context.Background()
	ids := map[string]bool{}
	for _, p := range plans {
		ids[p.id] = true
	}
	for i, now := range tp.keys(t) {
		var extra []string
		for k := range now {
			switch {
			case tp.keysThen[i][k], k == "rain:pools", k == "rain:life", k == "rain:reaper:lock":
			case strings.HasSuffix(k, "}:pool") && ids[strings.TrimSuffix(strings.TrimPrefix(k, "rain:{"), "}:pool")]:
			case strings.HasSuffix(k, ":meta"):
				if st, _ := tp.clients[i].HGet(ctx, k, "state").Result(); st != "closed" {
					extra = append(extra, k+" ("+st+")")
				}
			default:
				extra = append(extra, k)
			}
		}
		slices.Sort(extra)
		if len(extra) > 0 {
			t.Errorf("shard s%d holds, after every pool closed, keys beyond the records, the registry and the tombstones: %v", i+1, extra)
		}
	}
}

// report prints, every 30 s of a soak, each process's memory and the
// grabs' p99; it returns a function that stops it (and prints the last).
func (tp *topology) report(t *testing.T, soak time.Duration) (stop func()) {
	if soak == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func(began time.Time) {
		n, p99 := tp.users.cut()
		mem := fmt.Sprintf("rain-1 %5.1f MB  rain-2 %5.1f MB  settle %5.1f MB  postgres %5.1f MB",
			rssMB(tp.serves[0].PID()), rssMB(tp.serves[1].PID()), rssMB(tp.settle.PID()), pgRSS(tp.pg.PID()))
		for i, c := range tp.clients {
			used, _ := c.Info(context.Background(), "memory").Result()
			mem += fmt.Sprintf("  s%d %s", i+1, usedMemory(used))
		}
		fmt.Printf("soak %6s  %5.0f grabs/s  p99 %6.1f ms  %s\n", time.Since(began).Round(time.Second),
			float64(n)/30, float64(p99.Microseconds())/1000, mem)
	}
	began := time.Now()
	wg.Go(func() {
		tick := time.NewTicker(30 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				line(began)
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
