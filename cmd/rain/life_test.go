package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/logtest"
	"rain/internal/pgtest"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

// booksEnv is rain serve on two durable shards with a PostgreSQL database
// (--postgres), pool id preloaded (10 packets in 2 sub-pools) and granted
// to users u0 to u3.
type booksEnv struct {
	servers []*redistest.Server
	url     string // the database's
	addr    string // rain serve's
	environ map[string]string
	serials map[string]float64 // each user's grant
}

func newBooksEnv(t *testing.T, id string) *booksEnv {
	t.Helper()
	return newBooksEnvHeld(t, id, 0)
}

// newBooksEnvHeld is newBooksEnv with grants held hold seconds (0: the
// default).
func newBooksEnvHeld(t *testing.T, id string, hold int) *booksEnv {
	t.Helper()
	e := &booksEnv{servers: redistest.StartN(t, 2, durable), serials: map[string]float64{}}
	e.url = pgtest.Start(t, pgtest.Options{}).NewDB(t)
	e.environ = map[string]string{
		"RAIN_REDIS":       shardtest.Flag(redistest.Addrs(e.servers)),
		"RAIN_ADMIN_TOKEN": longToken,
	}
	e.addr, _ = startServe(t, []string{"--postgres", e.url}, e.environ)
	if code, body := post(t, "http://"+e.addr+"/admin/pools", longToken,
		fmt.Sprintf(`{"pool_id":%q,"total_cents":1000,"count":10,"sub_pools":2%s}`, id, holdField(hold))); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	for i := range 4 {
		user := fmt.Sprintf("u%d", i)
		code, body := post(t, "http://"+e.addr+"/grab", "", fmt.Sprintf(`{"pool_id":%q,"user_id":%q}`, id, user))
		if code != 200 {
			t.Fatalf("grab = %d %v", code, body)
		}
		e.serials[user] = body["serial"].(float64)
	}
	return e
}

// settleAndClose runs rain settle --postgres until rain close --postgres
// of pool id succeeds (once settlement has settled every grant into the
// database), and returns what the close printed.
func (e *booksEnv) settleAndClose(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"settle", "--postgres", e.url, "--consumer", "c1"}, env(e.environ), &bytes.Buffer{}, &logtest.Buffer{})
	}()
	t.Cleanup(cancel)
	var out string
	waittest.Until(t, 20*time.Second, "rain close succeeds once rain settle has settled every grant into PostgreSQL", func() bool {
		var err error
		out, err = e.tool("close", "--pool", id, "--postgres", e.url)
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("rain settle returned %v after cancel", err)
	}
	return out
}

// holdField is the preload's hold_seconds field for hold, "" for 0.
func holdField(hold int) string {
	if hold == 0 {
		return ""
	}
	return fmt.Sprintf(`,"hold_seconds":%d`, hold)
}

// tool runs a rain subcommand with the env's variables: what it printed.
func (e *booksEnv) tool(args ...string) (string, error) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, env(e.environ), &out, &errOut)
	return out.String(), err
}

// TestCloseCommand: a pool's whole life from the command line, on real
// shards and a real PostgreSQL: rain serve --postgres, grabs, rain close
// refused while the window is open, rain end, rain settle --postgres, and
// rain close --postgres, which reconciles with the database and records the
// account there. After the close the confirm of a grant is still
// idempotent (API.md): the database answers for the freed keys.
func TestCloseCommand(t *testing.T) {
	e := newBooksEnv(t, "cl")
	url, addr, serials, tool := e.url, e.addr, e.serials, e.tool
	if _, err := tool("close", "--pool", "cl", "--postgres", url); err == nil || !strings.Contains(err.Error(), "window open") {
		t.Fatalf("rain close of an open pool = %v, want an error naming the open window", err)
	}
	if out, err := tool("end", "--pool", "cl"); err != nil || !strings.Contains(out, `"state": "ended"`) {
		t.Fatalf("rain end = %q, %v; want the status, ended", out, err)
	}
	out := e.settleAndClose(t, "cl")
	var a map[string]any
	if err := json.Unmarshal([]byte(out), &a); err != nil || a["state"] != "closed" || a["confirmed_count"] != float64(4) {
		t.Fatalf("rain close printed %q (%v); want the account, 4 confirmed", out, err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var grants, confirmed int64
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM rain_grants WHERE pool_id = 'cl'`).Scan(&grants); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(context.Background(), `SELECT confirmed_count FROM rain_pools WHERE pool_id = 'cl'`).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if grants != 4 || confirmed != 4 {
		t.Fatalf("PostgreSQL holds %d grants and an account of %d confirmed; want 4 and 4", grants, confirmed)
	}
	if code, body := post(t, "http://"+addr+"/grab", "", `{"pool_id":"cl","user_id":"u1"}`); code != 410 {
		t.Fatalf("grab of a closed pool = %d %v, want 410 ended", code, body)
	}
	// Settlement confirmed every grant before the close; a confirm sent
	// again now (a wallet's retry) is answered as before the close.
	for _, c := range []struct {
		user   string
		serial float64
		code   int
	}{
		{"u0", serials["u0"], 200},
		{"u3", serials["u3"], 200},
		{"u0", serials["u0"] + 1000, 409}, // another serial than the user's grant
		{"nobody", 1, 404},
	} {
		code, body := post(t, "http://"+addr+"/admin/grants/confirm", longToken, fmt.Sprintf(`{"pool_id":"cl","user_id":%q,"serial":%d}`, c.user, int64(c.serial)))
		if code != c.code || (code == 200 && body["status"] != "confirmed") {
			t.Errorf("confirm of %s serial %d after the close = %d %v, want %d", c.user, int64(c.serial), code, body, c.code)
		}
	}
}

// TestReleasedGrantsAfterTheClose: grants released at their deadline
// before settlement saw them are recorded by rain settle --postgres as
// settled unpaid (rain_unpaid), none paid; the pool closes, and a confirm
// of one of them after the close answers 409, released, as before it
// (API.md), not 404.
func TestReleasedGrantsAfterTheClose(t *testing.T) {
	e := newBooksEnvHeld(t, "rl", 1)
	url, addr, serials, tool := e.url, e.addr, e.serials, e.tool
	confirm := func(user string, serial float64) int {
		code, _ := post(t, "http://"+addr+"/admin/grants/confirm", longToken, fmt.Sprintf(`{"pool_id":"rl","user_id":%q,"serial":%d}`, user, int64(serial)))
		return code
	}
	waittest.Until(t, 20*time.Second, "the grants released at their deadline", func() bool {
		code, body := get(t, "http://"+addr+"/admin/pools/rl", longToken)
		var st map[string]any
		return code == 200 && json.Unmarshal([]byte(body), &st) == nil && st["released_count"] == float64(4)
	})
	for u, s := range serials {
		if code := confirm(u, s); code != 409 {
			t.Fatalf("confirm of %s's released grant = %d, want 409", u, code)
		}
	}
	if _, err := tool("end", "--pool", "rl"); err != nil {
		t.Fatal(err)
	}
	out := e.settleAndClose(t, "rl")
	var a map[string]any
	if err := json.Unmarshal([]byte(out), &a); err != nil || a["confirmed_count"] != float64(0) || a["unclaimed_count"] != float64(10) {
		t.Fatalf("rain close printed %q (%v); want the account, none confirmed, the 10 back to the campaign", out, err)
	}
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var paid, released int64
	if err := conn.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM rain_grants WHERE pool_id = 'rl'),
		(SELECT count(*) FROM rain_unpaid WHERE pool_id = 'rl' AND reason = 'released')`).Scan(&paid, &released); err != nil {
		t.Fatal(err)
	}
	if paid != 0 || released != 4 {
		t.Fatalf("PostgreSQL holds %d grants paid and %d released; want none paid, the 4 released", paid, released)
	}
	for u, s := range serials {
		if code := confirm(u, s); code != 409 {
			t.Errorf("confirm of %s's released grant after the close = %d, want 409", u, code)
		}
	}
	if code := confirm("nobody", 1); code != 404 {
		t.Errorf("confirm of a user without a grant after the close = %d, want 404", code)
	}
}

// TestCloseRefusedWhenTheBooksDiffer: a close reconciles the shards with
// PostgreSQL, the system of record: once settlement has delivered every
// grant, a grant missing from the database (a row lost, deleted by hand)
// makes the close refuse, naming the sub-pool and both tallies, and leave
// everything as it was: the pool ended, not closed, no account written.
// Once the row is back, the close goes through (its seals were undone).
func TestCloseRefusedWhenTheBooksDiffer(t *testing.T) {
	e := newBooksEnv(t, "bk")
	servers, url, addr, environ, tool := e.servers, e.url, e.addr, e.environ, e.tool
	if _, err := tool("end", "--pool", "bk"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	outboxed := func() int64 {
		var n int64
		for _, srv := range servers {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			for j := range 2 {
				l, err := c.XLen(ctx, rain.SubPool{Pool: "bk", Index: j}.Keys().Outbox).Result()
				if err != nil {
					t.Fatal(err)
				}
				n += l
			}
			c.Close()
		}
		return n
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(sctx, []string{"settle", "--postgres", url, "--consumer", "c1"}, env(environ), &bytes.Buffer{}, &logtest.Buffer{})
	}()
	t.Cleanup(stop)
	waittest.Until(t, 20*time.Second, "every grant in PostgreSQL and every outbox entry settled", func() bool {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM rain_grants WHERE pool_id = 'bk'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 4 && outboxed() == 0
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("rain settle returned %v after cancel", err)
	}
	var serial, amount int64
	var sub int
	var user string
	var grantedAt time.Time
	if err := conn.QueryRow(ctx, `DELETE FROM rain_grants WHERE pool_id = 'bk' AND user_id = 'u1' RETURNING serial, sub_pool, amount_cents, granted_at`).
		Scan(&serial, &sub, &amount, &grantedAt); err != nil {
		t.Fatal(err)
	}
	user = "u1"
	_, err = tool("close", "--pool", "bk", "--postgres", url)
	if want := fmt.Sprintf("books: sub-pool %d holds", sub); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("rain close with a grant missing from PostgreSQL = %v, want a refusal naming %q", err, want)
	}
	if code, body := get(t, "http://"+addr+"/admin/pools/bk", longToken); code != 200 || !strings.Contains(body, `"state":"ended"`) {
		t.Fatalf("the pool after the refused close = %d %s, want ended", code, body)
	}
	var accounts int64
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM rain_pools WHERE pool_id = 'bk'`).Scan(&accounts); err != nil || accounts != 0 {
		t.Fatalf("rain_pools rows for the refused close: %d, %v; want none", accounts, err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO rain_grants (serial, pool_id, sub_pool, user_id, amount_cents, granted_at) VALUES ($1, 'bk', $2, $3, $4, $5)`,
		serial, sub, user, amount, grantedAt); err != nil {
		t.Fatal(err)
	}
	out, err := tool("close", "--pool", "bk", "--postgres", url)
	var a map[string]any
	if err != nil || json.Unmarshal([]byte(out), &a) != nil || a["state"] != "closed" || a["confirmed_count"] != float64(4) {
		t.Fatalf("rain close with the row back = %q, %v; want the account, 4 confirmed", out, err)
	}
}

// TestExitCodes: 0 done, 1 the work failed (an audit's problems, a close
// refused), 2 usage, 3 a shard or the database out of reach, for a script
// to tell apart without reading the message.
func TestExitCodes(t *testing.T) {
	srv := redistest.Start(t, durable)
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + srv.Addr}
	tool := func(args ...string) int {
		t.Helper()
		err := run(context.Background(), args, env(environ), &bytes.Buffer{}, &bytes.Buffer{})
		return exitCode(err)
	}
	if code := tool("preload", "--pool", "x", "--total-cents", "100", "--count", "10"); code != exitOK {
		t.Fatalf("rain preload = exit %d, want 0", code)
	}
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"audit", "--pool", "x"}, exitOK},
		{[]string{"close", "--pool", "x"}, exitFailed}, // its window is open
		{[]string{"audit", "--pool", "nope"}, exitFailed},
		{[]string{"audit"}, exitUsage},
		{[]string{"audit", "--pool", "x", "--bogus"}, exitUsage},
		{[]string{"audit", "--pool", "x", "--redis", "s1=1@127.0.0.1:1"}, exitUnreachable},
		{[]string{"end", "--pool", "x", "--redis", "s1=1@127.0.0.1:1"}, exitUnreachable},
		{[]string{"close", "--pool", "x", "--postgres", "postgres://rain@127.0.0.1:1/x?connect_timeout=1&sslmode=disable"}, exitUnreachable},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "jwks-url:https://127.0.0.1:1/jwks"}, exitUnreachable},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "jwks-url:http://127.0.0.1:1/jwks"}, exitUsage},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "jwks-url:http://127.0.0.1:1/jwks", "--user-auth-allow-http"}, exitUnreachable},
		{[]string{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "jwks-url:ftp://login/jwks"}, exitUsage},
	} {
		if code := tool(c.args...); code != c.want {
			t.Errorf("rain %v = exit %d, want %d", c.args, code, c.want)
		}
	}
	// An audit that finds problems: the work failed.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	if err := rdb.RPush(context.Background(), "rain:{x:0}:stock", 999).Err(); err != nil {
		t.Fatal(err)
	}
	if code := tool("audit", "--pool", "x"); code != exitFailed {
		t.Fatalf("rain audit of a corrupted pool = exit %d, want 1", code)
	}
}
