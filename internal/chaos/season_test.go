package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"rain/internal/instance"
	"rain/internal/lua"
	"rain/internal/pgtest"
	"rain/internal/postgres"
	"rain/internal/redistest"
	"rain/internal/settle"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// call sends one request to the API and decodes its JSON answer.
func call(t *testing.T, c *http.Client, method, url, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s %s = %d %q: not JSON", method, url, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// memory is a shard's used_memory less what its clients' buffers take
// (which moves with the connections open, not with the data), in bytes.
func memory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	ctx := context.Background()
	// A connection keeps buffers INFO does not count as the client's (its
	// largest argv, say): close the others so that the figure is the data.
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes").Err(); err != nil {
		t.Fatal(err)
	}
	// The instance's connections come back at once, and Redis counts a
	// client's memory in INFO's mem_clients_normal only once it has updated
	// it (after a command; a settle read blocks for its first 50 ms): on a
	// busy machine one such client's ~20 KB was left in the figure. CLIENT
	// LIST works out each client's memory as it answers, and in one
	// MULTI with INFO it names exactly the clients used_memory holds.
	pipe := c.TxPipeline()
	info := pipe.Info(ctx, "memory")
	list := pipe.ClientList(ctx)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	used := int64(-1)
	for line := range strings.Lines(info.Val()) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			used, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if used < 0 {
		t.Fatal("INFO memory has no used_memory")
	}
	var clients int64
	for line := range strings.Lines(list.Val()) {
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "tot-mem="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("CLIENT LIST: %q", f)
				}
				clients += n
			}
		}
	}
	return used - clients
}

// memoryStats is MEMORY STATS of a shard, its byte figures by name (a
// database's as db.N.name), for a failure's log.
func memoryStats(ctx context.Context, c *redis.Client) map[string]int64 {
	m := map[string]int64{}
	var walk func(name string, v any)
	walk = func(name string, v any) {
		at := func(k any) string {
			if name == "" {
				return fmt.Sprint(k)
			}
			return name + "." + fmt.Sprint(k)
		}
		switch v := v.(type) {
		case []any: // RESP2: name, value, name, value, ...
			for i := 0; i+1 < len(v); i += 2 {
				walk(at(v[i]), v[i+1])
			}
		case map[any]any: // RESP3
			for k, x := range v {
				walk(at(k), x)
			}
		case int64:
			m[name] = v
		}
	}
	if r, err := c.Do(ctx, "MEMORY", "STATS").Result(); err == nil {
		walk("", r)
	}
	return m
}

// keyUsage is MEMORY USAGE of every key of a shard, by key.
func keyUsage(ctx context.Context, c *redis.Client) map[string]int64 {
	u := map[string]int64{}
	for _, k := range c.Keys(ctx, "*").Val() {
		u[k] = c.MemoryUsage(ctx, k, 0).Val()
	}
	return u
}

// steadyMemory is memory once two readings in a row agree (a client that
// reconnects between the kill and the reading, the settle worker's, say,
// moves a reading by tens of KB).
func steadyMemory(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	last := memory(t, c)
	var m int64
	waittest.Until(t, 10*time.Second, "two readings of used_memory agree", func() bool {
		m = memory(t, c)
		same := m == last
		last = m
		return same
	})
	return m
}

// books is a rain serve on two shards whose settlement delivers into a
// private PostgreSQL and whose closes reconcile with it.
type books struct {
	pg      *pgtest.Server
	url     string
	db      *postgres.DB
	servers []*redistest.Server
	in      *instance.Instance
	base    string // the API listener's URL
}

// startBooks starts it: the shards with opts, the in-process settle
// worker with sc (its reads and refreshes quick, for a test).
func startBooks(t *testing.T, opts redistest.Options, sc settle.Config) *books {
	t.Helper()
	b := &books{pg: pgtest.Start(t, pgtest.Options{})}
	b.url = b.pg.NewDB(t)
	var err error
	if b.db, err = postgres.Open(context.Background(), b.url); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.db.Close)
	b.servers = redistest.StartN(t, 2, opts)
	specs := shardtest.Specs(redistest.Addrs(b.servers))
	sc.Consumer, sc.Block, sc.Refresh = "in-process", 50*time.Millisecond, 100*time.Millisecond
	b.in, b.base = startInstance(t, specs, func(c *instance.Config) {
		c.Books, c.Settle, c.SettleConfig = b.db, b.db, sc
	})
	return b
}

// TestSeason: ten rains back to back on one rain serve whose settlement
// delivers into PostgreSQL and whose closes reconcile with it: each pool
// preloaded, grabbed over HTTP, ended, settled, closed. A first rain warms
// the shards up: Redis makes some of its own structures the first time it
// needs them, and on a busy machine a shard has held ~7 KB more than
// before the first pool, in no key, for more than 30 s after its close
// (and ~67 KB less a little later). After the close of each of the ten
// the shards hold what they held before that pool, within a few KB (the
// pool's record, with its account, and its id in the registry stay; the
// other connections closed before each reading and every client's memory
// left out of it, so that the figure is the data, not their buffers), and
// PostgreSQL holds
// every grant answered granted, once, with the amount the user was told;
// the account in rain_pools is the one the close answered.
func TestSeason(t *testing.T) {
	ctx := context.Background()
	// Redis allocates a latency histogram (~25 KB) the first time each
	// command runs (latency-tracking, on by default): once per server,
	// whatever the pools. Off here, the figures are what pools leave.
	b := startBooks(t, redistest.Options{Args: []string{"--latency-tracking", "no"}}, settle.Config{RetryDelay: 100 * time.Millisecond})
	servers, db, url, in, base := b.servers, b.db, b.url, b.in, b.base
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	// The readings go through connections of their own, which send
	// nothing else (a connection keeps the largest argv it was sent).
	shards := make([]*redis.Client, 0, 2)
	for i, name := range in.Shards.Names() {
		if err := lua.LoadScripts(ctx, in.Shards.Client(name)); err != nil { // the script cache is not a pool's
			t.Fatal(err)
		}
		c := redis.NewClient(&redis.Options{Addr: servers[i].Addr, PoolSize: 1})
		t.Cleanup(func() { c.Close() })
		shards = append(shards, c)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	const users, slack = 300, 4 << 10
	for round := range 11 {
		id, warm := fmt.Sprintf("night-%d", round-1), round == 0
		if warm {
			id = "warm-up"
		}
		before := make([]int64, len(shards))
		usage := make([]map[string]int64, len(shards)) // by key, for a failure's log
		stats := make([]map[string]int64, len(shards)) // MEMORY STATS, for a failure's log
		for i, c := range shards {
			before[i] = steadyMemory(t, c)
			usage[i] = keyUsage(ctx, c)
			stats[i] = memoryStats(ctx, c)
		}
		body := fmt.Sprintf(`{"pool_id":%q,"total_cents":200000,"count":2000,"sub_pools":4}`, id)
		if code, m := call(t, client, "POST", base+"/admin/pools", adminToken, body); code != 201 {
			t.Fatalf("preload %s = %d %v", id, code, m)
		}
		granted := map[int64]int64{} // serial -> cents, as the users were told
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for u := w; u < users; u += 8 {
					code, m := call(t, client, "POST", base+"/grab", "", fmt.Sprintf(`{"pool_id":%q,"user_id":"user-%d"}`, id, u))
					if code != 200 || m["status"] != "granted" {
						t.Errorf("grab = %d %v", code, m)
						return
					}
					mu.Lock()
					granted[int64(m["serial"].(float64))] = int64(m["amount_cents"].(float64))
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if code, m := call(t, client, "POST", base+"/admin/pools/"+id+"/end", adminToken, ""); code != 200 {
			t.Fatalf("end %s = %d %v", id, code, m)
		}
		var account map[string]any
		waittest.Until(t, 30*time.Second, id+" closes once settled into PostgreSQL", func() bool {
			code, m := call(t, client, "POST", base+"/admin/pools/"+id+"/close", adminToken, "")
			account = m
			return code == 200
		})
		var cents int64
		for _, c := range granted {
			cents += c
		}
		if int64(account["confirmed_count"].(float64)) != users || int64(account["confirmed_cents"].(float64)) != cents ||
			int64(account["unclaimed_cents"].(float64)) != 200000-cents {
			t.Fatalf("%s account %v; want %d confirmed, %d cents", id, account, users, cents)
		}
		rows, err := conn.Query(ctx, `SELECT serial, amount_cents FROM rain_grants WHERE pool_id = $1`, id)
		if err != nil {
			t.Fatal(err)
		}
		inDB, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]int64, error) {
			var v [2]int64
			return v, r.Scan(&v[0], &v[1])
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(inDB) != len(granted) {
			t.Fatalf("%s: PostgreSQL holds %d grants, the users were granted %d", id, len(inDB), len(granted))
		}
		for _, r := range inDB {
			if c, ok := granted[r[0]]; !ok || c != r[1] {
				t.Fatalf("%s: PostgreSQL holds serial %d for %d cents; the user was told %d (%v)", id, r[0], r[1], c, ok)
			}
		}
		rec, err := db.Account(ctx, id)
		if err != nil || rec.ConfirmedCents != cents || rec.UnclaimedCents != 200000-cents {
			t.Fatalf("%s: rain_pools holds %+v, %v; want the close's account", id, rec, err)
		}
		for i, c := range shards {
			if warm {
				break // see above: the ten after it are measured
			}
			// On a busy machine a shard was seen to hold 6 to 22 KB more
			// than before for 30 s after the close, in no key (MEMORY USAGE
			// of each was back): the memory of a client that had just
			// reconnected, which INFO had not counted yet (memory now takes
			// each client's from CLIENT LIST). Wait for the state all the
			// same, and name what differs while it does not come.
			what := fmt.Sprintf("%s: shard %d's memory back within %d bytes of before the pool", id, i+1, slack)
			var told time.Time
			waittest.Until(t, 30*time.Second, what, func() bool {
				if memory(t, c)-before[i] <= slack {
					return true
				}
				if time.Since(told) > 5*time.Second {
					told = time.Now()
					var desc []string
					for k, u := range keyUsage(ctx, c) {
						if u != usage[i][k] {
							desc = append(desc, fmt.Sprintf("%s %d -> %d bytes", k, usage[i][k], u))
						}
					}
					var moved []string
					for k, v := range memoryStats(ctx, c) {
						if d := v - stats[i][k]; (d > 256 || d < -256) && !strings.Contains(k, "ratio") && !strings.Contains(k, "percentage") {
							moved = append(moved, fmt.Sprintf("%s %+d", k, d))
						}
					}
					slices.Sort(moved)
					lazy := "?"
					if info, err := c.Info(ctx, "memory").Result(); err == nil {
						if _, v, ok := strings.Cut(info, "lazyfree_pending_objects:"); ok {
							lazy, _, _ = strings.Cut(v, "\r\n")
						}
					}
					t.Logf("%s: not yet (%d); keys %v; MEMORY STATS %v; lazyfree_pending_objects %s", what, memory(t, c)-before[i], desc, moved, lazy)
				}
				time.Sleep(10 * time.Millisecond)
				return false
			})
		}
		t.Logf("%s: %d grants, %d cents settled and closed; memory %+d, %+d bytes", id, len(granted), cents,
			steadyMemory(t, shards[0])-before[0], steadyMemory(t, shards[1])-before[1])
	}
}

// TestSettleWhileTheDatabaseIsDown: with PostgreSQL down, settlement
// acknowledges nothing (every outbox entry stays, the lag grows, the
// failures are counted) and the pool cannot close; once the database is
// back, settlement catches up and the close reconciles: PostgreSQL holds
// every grant once.
func TestSettleWhileTheDatabaseIsDown(t *testing.T) {
	ctx := context.Background()
	b := startBooks(t, redistest.Options{}, settle.Config{RetryDelay: 50 * time.Millisecond, MaxRetryDelay: 400 * time.Millisecond})
	pg, db, in, base := b.pg, b.db, b.in, b.base
	pg.Stop()
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	if code, m := call(t, client, "POST", base+"/admin/pools", adminToken, `{"pool_id":"dark","total_cents":10000,"count":100,"sub_pools":2}`); code != 201 {
		t.Fatalf("preload = %d %v", code, m)
	}
	for u := range 40 {
		if code, m := call(t, client, "POST", base+"/grab", "", fmt.Sprintf(`{"pool_id":"dark","user_id":"u%d"}`, u)); code != 200 {
			t.Fatalf("grab = %d %v", code, m)
		}
	}
	outbox := func() int64 {
		p, err := in.Catalog.Cached(ctx, "dark")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for j := range p.SubPools() {
			k := p.SubPool(j).Keys()
			n += in.Shards.Client(p.Placement[j]).XLen(ctx, k.Outbox).Val()
		}
		return n
	}
	waittest.Until(t, 20*time.Second, "settlement falls behind with the database down: its lag grows and its failures are counted", func() bool {
		st := in.Settler.Stats()
		return st.Lag > time.Second && st.Failures > 3
	})
	if n := outbox(); n != 40 {
		t.Fatalf("%d outbox entries with the database down, want all 40: nothing acknowledged", n)
	}
	if st := in.Settler.Stats(); st.Delivered != 0 {
		t.Fatalf("%d grants delivered to a database that is down", st.Delivered)
	}
	if code, m := call(t, client, "POST", base+"/admin/pools/dark/end", adminToken, ""); code != 200 {
		t.Fatalf("end = %d %v", code, m)
	}
	if code, m := call(t, client, "POST", base+"/admin/pools/dark/close", adminToken, ""); code != 409 {
		t.Fatalf("close with the database down = %d %v, want 409", code, m)
	}
	pg.Restart()
	waittest.Until(t, 30*time.Second, "the database back, settlement catches up and the pool closes", func() bool {
		code, _ := call(t, client, "POST", base+"/admin/pools/dark/close", adminToken, "")
		return code == 200
	})
	totals, err := db.Totals(ctx, "dark")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, tl := range totals {
		n += tl.Count
	}
	if n != 40 {
		t.Fatalf("PostgreSQL holds %d grants of the pool, want 40", n)
	}
}
