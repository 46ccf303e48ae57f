package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// client returns a go-redis client (RESP2) for addr, closed in t's cleanup.
// maxRetries is go-redis's MaxRetries: 0 means its default of 3, -1 none.
func client(t *testing.T, addr string, maxRetries int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: maxRetries})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// counter reads an integer key straight from the server; a missing key is 0.
func counter(t *testing.T, rdb *redis.Client, key string) int {
	t.Helper()
	n, err := rdb.Get(context.Background(), key).Int()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	return n
}

// rawConn speaks RESP by hand, for what go-redis hides: inline commands,
// push frames, the exact moment a connection dies.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{c: c, r: bufio.NewReader(c)}
}

func (rc *rawConn) send(args ...string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	_, err := rc.c.Write([]byte(b.String()))
	return err
}

// read returns the next reply, as sent on the wire.
func (rc *rawConn) read() (string, error) {
	var sc scanner
	var out []byte
	for {
		b, err := rc.r.ReadByte()
		if err != nil {
			return string(out), err
		}
		out = append(out, b)
		_, end, err := sc.scan([]byte{b})
		if err != nil {
			return string(out), err
		}
		if end {
			return string(out), nil
		}
	}
}

func (rc *rawConn) do(t *testing.T, args ...string) string {
	t.Helper()
	if err := rc.send(args...); err != nil {
		t.Fatalf("send %v: %v", args, err)
	}
	reply, err := rc.read()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return reply
}

func TestProxyForwards(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)

	big := strings.Repeat("x", 3<<20) // many reads on either side
	if err := rdb.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatalf("SET big: %v", err)
	}
	if got, err := rdb.Get(ctx, "big").Result(); err != nil || got != big {
		t.Fatalf("GET big = %d bytes, %v; want %d bytes", len(got), err, len(big))
	}

	pipe := rdb.Pipeline()
	incrs := make([]*redis.IntCmd, 1000)
	for i := range incrs {
		incrs[i] = pipe.Incr(ctx, "n")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipeline: %v", err)
	}
	for i, c := range incrs {
		if c.Val() != int64(i+1) {
			t.Fatalf("pipelined INCR %d = %d, want %d", i, c.Val(), i+1)
		}
	}

	// RESP3: maps, sets, doubles, nulls.
	r3 := redis.NewClient(&redis.Options{Addr: p.Addr, Protocol: 3, MaxRetries: -1})
	defer r3.Close()
	if err := r3.HSet(ctx, "h", "a", "1", "b", "2").Err(); err != nil {
		t.Fatalf("HSET: %v", err)
	}
	if got, err := r3.HGetAll(ctx, "h").Result(); err != nil || len(got) != 2 || got["b"] != "2" {
		t.Fatalf("HGETALL h = %v, %v; want a:1 b:2", got, err)
	}
	if got, err := r3.IncrByFloat(ctx, "f", 1.5).Result(); err != nil || got != 1.5 {
		t.Fatalf("INCRBYFLOAT = %v, %v; want 1.5", got, err)
	}
	if err := r3.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET missing: err = %v, want redis.Nil", err)
	}

	// Inline commands pass through and keep the pairing.
	rc := dialRaw(t, p.Addr)
	if _, err := rc.c.Write([]byte("\r\nPING\r\nECHO hi\r\n")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"+PONG\r\n", "$2\r\nhi\r\n"} {
		if got, err := rc.read(); err != nil || got != want {
			t.Fatalf("inline reply = %q, %v; want %q", got, err, want)
		}
	}
}

func TestProxyForwardsAfterReset(t *testing.T) {
	// A rule resets one connection; the proxy keeps serving others.
	s := Start(t, Options{})
	p := NewProxy(t, s.Addr)
	p.DropReplies(Named("ECHO"), 1)
	rc := dialRaw(t, p.Addr)
	if err := rc.send("ECHO", "x"); err != nil {
		t.Fatal(err)
	}
	if got, err := rc.read(); err == nil {
		t.Fatalf("ECHO through DropReplies = %q, want a reset connection", got)
	}
	if got := dialRaw(t, p.Addr).do(t, "ECHO", "y"); got != "$1\r\ny\r\n" {
		t.Fatalf("ECHO on a new connection = %q, want $1 y", got)
	}
	if st := p.Stats(); st.Conns != 2 || st.SwallowedReplies["ECHO"] != 1 {
		t.Fatalf("Stats = %+v, want 2 conns and 1 swallowed ECHO", st)
	}
}

func TestDropRepliesIncr(t *testing.T) {
	tests := []struct {
		name       string
		maxRetries int
		wantErr    bool
		want       int // INCR runs at Redis
	}{
		// The INCR ran and its reply was lost; go-redis saw the connection
		// reset (a network error, which it retries) and sent the INCR again on
		// a new connection. So it ran twice and the one call returns 2: a
		// retry of a non-idempotent command double-applies it.
		{name: "retries", maxRetries: 0, want: 2},
		// Without retries the call fails, but the INCR ran: an error does not
		// mean the command did not run.
		{name: "no retries", maxRetries: -1, wantErr: true, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := Start(t, Options{})
			direct := client(t, s.Addr, -1)
			p := NewProxy(t, s.Addr)
			rdb := client(t, p.Addr, tt.maxRetries)
			p.DropReplies(Named("INCR"), 1)

			got, err := rdb.Incr(ctx, "n").Result()
			if tt.wantErr {
				if err == nil {
					t.Fatalf("INCR = %d, nil; want an error", got)
				}
			} else if err != nil || got != int64(tt.want) {
				t.Fatalf("INCR = %d, %v; want %d, nil", got, err, tt.want)
			}
			if n := counter(t, direct, "n"); n != tt.want {
				t.Fatalf("n = %d after one INCR call, want %d", n, tt.want)
			}
			st := p.Stats()
			if st.SwallowedReplies["INCR"] != 1 {
				t.Fatalf("SwallowedReplies = %v, want INCR:1", st.SwallowedReplies)
			}
			if st.Conns != tt.want {
				t.Fatalf("Conns = %d, want %d (one per attempt)", st.Conns, tt.want)
			}
		})
	}
}

func TestDropRequestsSet(t *testing.T) {
	tests := []struct {
		name       string
		maxRetries int
		wantErr    bool
	}{
		{name: "no retries", maxRetries: -1, wantErr: true},
		// The retry's SET is the first to reach Redis.
		{name: "retries", maxRetries: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := Start(t, Options{})
			direct := client(t, s.Addr, -1)
			p := NewProxy(t, s.Addr)
			rdb := client(t, p.Addr, tt.maxRetries)
			if err := rdb.Ping(ctx).Err(); err != nil { // a connection before the rule
				t.Fatal(err)
			}
			p.DropRequests(Named("SET"), 1)

			err := rdb.Set(ctx, "k", "v", 0).Err()
			if (err != nil) != tt.wantErr {
				t.Fatalf("SET: err = %v, want error %v", err, tt.wantErr)
			}
			got, gerr := direct.Get(ctx, "k").Result()
			if tt.wantErr && !errors.Is(gerr, redis.Nil) {
				t.Fatalf("GET k = %q, %v; want redis.Nil (the SET never ran)", got, gerr)
			}
			if !tt.wantErr && got != "v" {
				t.Fatalf("GET k = %q, %v; want v", got, gerr)
			}
			if st := p.Stats(); st.DroppedRequests["SET"] != 1 || len(st.SwallowedReplies) != 0 {
				t.Fatalf("Stats = %+v, want one dropped SET and nothing swallowed", st)
			}
			// The rule is used up.
			if err := rdb.Set(ctx, "k", "w", 0).Err(); err != nil {
				t.Fatalf("second SET: %v", err)
			}
		})
	}
}

// pipelineKey is the key of the i-th (1-based) INCR of the pipeline tests.
func pipelineKey(i int) string { return "k" + strconv.Itoa(i) }

// dropFifth matches the fifth INCR of the pipeline.
func dropFifth(cmd []string) bool { return cmd[0] == "INCR" && cmd[1] == pipelineKey(5) }

func runPipeline(ctx context.Context, rdb *redis.Client) ([]*redis.IntCmd, error) {
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, 10)
	for i := range cmds {
		cmds[i] = pipe.Incr(ctx, pipelineKey(i+1))
	}
	_, err := pipe.Exec(ctx)
	return cmds, err
}

func TestDropReplyMidPipeline(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)
	p.DropReplies(dropFifth, 1)

	cmds, err := runPipeline(ctx, rdb)
	if err == nil {
		t.Fatal("pipeline with a swallowed reply: Exec err = nil, want an error")
	}
	for i := 4; i < 10; i++ {
		if cmds[i].Err() == nil {
			t.Fatalf("INCR %s: err = nil, want the connection's error", pipelineKey(i+1))
		}
	}
	// Replies 1..4 were forwarded before the reset; go-redis usually reads
	// them (a RST does not discard what the client already received).
	for i := range 4 {
		t.Logf("INCR %s = %d, %v", pipelineKey(i+1), cmds[i].Val(), cmds[i].Err())
	}
	for i := 1; i <= 5; i++ {
		if n := counter(t, direct, pipelineKey(i)); n != 1 {
			t.Fatalf("%s = %d, want 1: commands up to the swallowed reply ran", pipelineKey(i), n)
		}
	}
	// Commands 6..10 went to Redis in the same write as 1..5, and Redis runs
	// a pipeline's commands before the proxy sees reply 5, so they ran too;
	// the client cannot know that. Only a pipeline larger than Redis reads at
	// once could have commands still unread when the proxy closes the server
	// connection, and those would not run. Either way none ran twice.
	ran := 0
	for i := 6; i <= 10; i++ {
		n := counter(t, direct, pipelineKey(i))
		if n > 1 {
			t.Fatalf("%s = %d, want 0 or 1", pipelineKey(i), n)
		}
		ran += n
	}
	t.Logf("commands 6..10 after the swallowed reply: %d of 5 ran", ran)
	if st := p.Stats(); st.SwallowedReplies["INCR"] != 1 {
		t.Fatalf("SwallowedReplies = %v, want INCR:1", st.SwallowedReplies)
	}
}

func TestDropReplyMidPipelineRetried(t *testing.T) {
	// With go-redis's default MaxRetries (3), a pipeline that loses a reply
	// is sent again whole on a new connection: the network error is
	// retryable, and go-redis does not know which commands ran. Every INCR
	// ran twice, Exec returns nil, and every result is 2.
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, 0)
	p.DropReplies(dropFifth, 1)

	cmds, err := runPipeline(ctx, rdb)
	if err != nil {
		t.Fatalf("pipeline: %v, want nil (retried)", err)
	}
	for i, c := range cmds {
		if c.Val() != 2 {
			t.Errorf("INCR %s = %d, want 2 (ran twice)", pipelineKey(i+1), c.Val())
		}
		if n := counter(t, direct, pipelineKey(i+1)); n != 2 {
			t.Errorf("%s = %d, want 2", pipelineKey(i+1), n)
		}
	}
}

func TestDropRepliesExactlyN(t *testing.T) {
	// A rule's count holds under concurrent traffic on many connections.
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)
	const workers, each, drops = 8, 50, 5
	p.DropReplies(Named("INCR"), drops)

	var mu sync.Mutex // guards failed
	failed := 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				if err := rdb.Incr(ctx, "n").Err(); err != nil {
					mu.Lock()
					failed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed != drops {
		t.Fatalf("%d INCR calls failed, want %d", failed, drops)
	}
	if n := counter(t, direct, "n"); n != workers*each {
		t.Fatalf("n = %d, want %d (a swallowed reply's INCR ran)", n, workers*each)
	}
	if st := p.Stats(); st.SwallowedReplies["INCR"] != drops {
		t.Fatalf("SwallowedReplies = %v, want INCR:%d", st.SwallowedReplies, drops)
	}
}

func TestReplyLoss(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, 0)
	p.SetReplyLoss(0.05, 1)

	const workers, each = 4, 500
	var mu sync.Mutex // guards ok and failed
	ok, failed := 0, 0
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				err := rdb.Incr(ctx, "n").Err()
				mu.Lock()
				if err == nil {
					ok++
				} else {
					failed++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	p.SetReplyLoss(0, 0)

	n := counter(t, direct, "n")
	st := p.Stats()
	swallowed := st.SwallowedReplies["INCR"]
	t.Logf("%d INCR calls: %d ok, %d failed; n = %d; swallowed %v; %d conns",
		workers*each, ok, failed, n, st.SwallowedReplies, st.Conns)
	if ok+failed != workers*each {
		t.Fatalf("%d calls returned, want %d", ok+failed, workers*each)
	}
	if n < ok {
		t.Fatalf("n = %d < %d successful INCR calls", n, ok)
	}
	if swallowed == 0 {
		t.Fatal("no INCR reply swallowed at 5% loss")
	}
	// Each connection has one INCR in flight at a time, so every INCR that
	// reached Redis either answered a successful call or had its reply
	// swallowed.
	if n != ok+swallowed {
		t.Fatalf("n = %d, want %d successes + %d swallowed", n, ok, swallowed)
	}
}

// lossPattern sends 100 PINGs one at a time through a proxy with reply loss
// at rate and seed, reconnecting after each loss, and returns which were
// lost.
func lossPattern(t *testing.T, target string, rate float64, seed uint64) []int {
	t.Helper()
	p := NewProxy(t, target)
	p.SetReplyLoss(rate, seed)
	var lost []int
	rc := dialRaw(t, p.Addr)
	for i := range 100 {
		if err := rc.send("PING"); err != nil {
			t.Fatalf("PING %d: %v", i, err)
		}
		if _, err := rc.read(); err != nil {
			lost = append(lost, i)
			rc = dialRaw(t, p.Addr)
		}
	}
	if st := p.Stats(); st.SwallowedReplies["PING"] != len(lost) {
		t.Fatalf("SwallowedReplies = %v, want PING:%d", st.SwallowedReplies, len(lost))
	}
	return lost
}

func TestReplyLossDeterministic(t *testing.T) {
	s := Start(t, Options{})
	a := lossPattern(t, s.Addr, 0.3, 7)
	b := lossPattern(t, s.Addr, 0.3, 7)
	c := lossPattern(t, s.Addr, 0.3, 8)
	if len(a) == 0 {
		t.Fatal("no PING lost at 30% loss")
	}
	if !slices.Equal(a, b) {
		t.Fatalf("seed 7 lost %v, then %v; want the same", a, b)
	}
	if slices.Equal(a, c) {
		t.Fatalf("seeds 7 and 8 both lost %v; want different losses", a)
	}
}

func TestDropRepliesScripts(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)

	incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	other := redis.NewScript(`return redis.call('DECR', KEYS[1])`)
	if err := incr.Load(ctx, direct).Err(); err != nil {
		t.Fatal(err)
	}
	bySHA := func(sha string) func([]string) bool {
		return func(cmd []string) bool { return cmd[0] == "EVALSHA" && cmd[1] == sha }
	}
	p.DropReplies(bySHA(other.Hash()), 1) // never matches below
	p.DropReplies(bySHA(incr.Hash()), 1)

	if got, err := incr.Run(ctx, rdb, []string{"n"}).Int(); err == nil {
		t.Fatalf("EVALSHA with its reply swallowed = %d, nil; want an error", got)
	}
	if n := counter(t, direct, "n"); n != 1 {
		t.Fatalf("n = %d, want 1: the script ran", n)
	}
	if got, err := incr.Run(ctx, rdb, []string{"n"}).Int(); err != nil || got != 2 {
		t.Fatalf("second run = %d, %v; want 2 (the rule is used up)", got, err)
	}

	// A script Redis does not have: Run's EVALSHA gets NOSCRIPT and falls
	// back to EVAL, whose reply is lost.
	fresh := redis.NewScript(`return redis.call('INCRBY', KEYS[1], 10)`)
	p.DropReplies(Named("EVAL"), 1)
	if got, err := fresh.Run(ctx, rdb, []string{"n"}).Int(); err == nil {
		t.Fatalf("EVAL with its reply swallowed = %d, nil; want an error", got)
	}
	if n := counter(t, direct, "n"); n != 12 {
		t.Fatalf("n = %d, want 12: the EVAL ran", n)
	}
	st := p.Stats()
	if st.SwallowedReplies["EVALSHA"] != 1 || st.SwallowedReplies["EVAL"] != 1 {
		t.Fatalf("SwallowedReplies = %v, want EVALSHA:1 EVAL:1", st.SwallowedReplies)
	}
}

func TestProxyPubSubPassesThrough(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)

	sub := rdb.Subscribe(ctx, "ch")
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatalf("SUBSCRIBE: %v", err)
	}
	// A subscribed connection's messages are not replies: no rule applies.
	p.DropReplies(func([]string) bool { return true }, 1000)
	p.SetReplyLoss(1, 1)
	for i := range 3 {
		if err := direct.Publish(ctx, "ch", strconv.Itoa(i)).Err(); err != nil {
			t.Fatal(err)
		}
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil || msg.Payload != strconv.Itoa(i) {
			t.Fatalf("message %d = %v, %v", i, msg, err)
		}
	}
	if st := p.Stats(); len(st.SwallowedReplies) != 0 {
		t.Fatalf("SwallowedReplies = %v on a subscribed connection, want none", st.SwallowedReplies)
	}
}

func TestProxyPushIsNotAReply(t *testing.T) {
	// A RESP3 push frame that arrives while a command awaits its reply must
	// not be taken for that reply.
	ctx := context.Background()
	s := Start(t, Options{})
	direct := client(t, s.Addr, -1)
	p := NewProxy(t, s.Addr)
	p.DropReplies(Named("BLPOP"), 1)

	rc := dialRaw(t, p.Addr)
	if got := rc.do(t, "HELLO", "3"); !strings.HasPrefix(got, "%") {
		t.Fatalf("HELLO 3 = %q, want a map", got)
	}
	if got := rc.do(t, "CLIENT", "TRACKING", "ON"); got != "+OK\r\n" {
		t.Fatalf("CLIENT TRACKING ON = %q", got)
	}
	if got := rc.do(t, "GET", "k"); got != "_\r\n" {
		t.Fatalf("GET k = %q, want RESP3 null", got)
	}
	if err := rc.send("BLPOP", "l", "0"); err != nil {
		t.Fatal(err)
	}
	// The proxy queued BLPOP before forwarding it, so once Redis has it
	// blocked, the invalidation push below finds BLPOP pending.
	waitBlocked(t, direct, 1)
	if err := direct.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	push, err := rc.read()
	if err != nil || !strings.HasPrefix(push, ">2\r\n$10\r\ninvalidate\r\n") {
		t.Fatalf("push = %q, %v; want an invalidation", push, err)
	}
	if err := direct.LPush(ctx, "l", "x").Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := rc.read(); err == nil {
		t.Fatalf("BLPOP reply = %q, want it swallowed", got)
	}
	if n, err := direct.LLen(ctx, "l").Result(); err != nil || n != 0 {
		t.Fatalf("LLEN l = %d, %v; want 0: BLPOP ran", n, err)
	}
}

// waitBlocked waits until n clients of rdb's server are blocked.
func waitBlocked(t *testing.T, rdb *redis.Client, n int) {
	t.Helper()
	want := "blocked_clients:" + strconv.Itoa(n) + "\r"
	for range 500 {
		info, err := rdb.Info(context.Background(), "clients").Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(info, want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never saw %d blocked clients", n)
}

func TestProxyServerKilled(t *testing.T) {
	// The proxy passes a crash on: the client's connection ends, and new
	// connections reach the restarted server.
	ctx := context.Background()
	s := Start(t, Options{AOF: true, Fsync: "always"})
	p := NewProxy(t, s.Addr)
	rdb := client(t, p.Addr, -1)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if err := rdb.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET through the proxy of a killed server succeeded")
	}
	s.Restart()
	got, err := rdb.Get(ctx, "k").Result()
	if err != nil {
		got, err = rdb.Get(ctx, "k").Result() // the pool may hold one dead connection
	}
	if err != nil || got != "v" {
		t.Fatalf("GET k after restart = %q, %v; want v", got, err)
	}
}

func TestProxyCloseStopsGoroutines(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	ignore := goleak.IgnoreCurrent()
	p := NewProxy(t, s.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	pipe := rdb.Pipeline()
	for range 100 {
		pipe.Incr(ctx, "n")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	sub := rdb.Subscribe(ctx, "ch")
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// A connection parked halfway through a command, and one blocked in
	// BLPOP: Close must end both.
	half := dialRaw(t, p.Addr)
	if _, err := half.c.Write([]byte("*2\r\n$3\r\nGET")); err != nil {
		t.Fatal(err)
	}
	blocked := dialRaw(t, p.Addr)
	if err := blocked.send("BLPOP", "l", "0"); err != nil {
		t.Fatal(err)
	}
	waitBlocked(t, client(t, s.Addr, -1), 1)

	_ = sub.Close()
	_ = rdb.Close()
	p.Close()
	if _, err := blocked.read(); err == nil {
		t.Fatal("BLPOP answered after Close, want the connection closed")
	}
	p.Close() // again: a no-op
	goleak.VerifyNone(t, ignore)
}

// stream is a reply stream made of frames; the scanner must find each end.
var scannerFrames = []string{
	"+OK\r\n",
	"-ERR bad\r\n",
	":-12\r\n",
	"$5\r\nhello\r\n",
	"$6\r\nfo\r\nb\n\r\n", // CRLF inside a bulk
	"$0\r\n\r\n",
	"$-1\r\n",
	"*-1\r\n",
	"*0\r\n",
	"*2\r\n$1\r\na\r\n*2\r\n:1\r\n_\r\n",
	"%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n,1.5\r\n",
	"~1\r\n#t\r\n",
	">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n",
	"!5\r\nERR x\r\n",
	"=8\r\ntxt:abcd\r\n",
	"(123456789012345678901234\r\n",
	"|1\r\n+key\r\n+val\r\n:7\r\n",               // a top-level attribute and its reply
	"*2\r\n|1\r\n+a\r\n+b\r\n:1\r\n|0\r\n:2\r\n", // attributes inside an array
	"*1\r\n*1\r\n*1\r\n*0\r\n",
	"%0\r\n",
	"_\r\n",
}

// scanAll feeds chunks to a scanner and returns the offsets where replies
// end, and whether it failed.
func scanAll(chunks [][]byte) (ends []int, failed bool) {
	var sc scanner
	off := 0
	for _, c := range chunks {
		for len(c) > 0 {
			n, end, err := sc.scan(c)
			if err != nil {
				return ends, true
			}
			off += n
			c = c[n:]
			if end {
				if !sc.idle() {
					panic("scanner not idle at a reply's end")
				}
				ends = append(ends, off)
			}
		}
	}
	return ends, false
}

// splits returns data whole, split at k, and byte by byte.
func splits(data []byte, k int) [][][]byte {
	k = min(max(k, 0), len(data))
	bytewise := make([][]byte, len(data))
	for i := range data {
		bytewise[i] = data[i : i+1]
	}
	return [][][]byte{{data}, {data[:k], data[k:]}, bytewise}
}

func TestScanner(t *testing.T) {
	var stream []byte
	var want []int
	for _, f := range scannerFrames {
		stream = append(stream, f...)
		want = append(want, len(stream))
	}
	for i, chunks := range splits(stream, len(stream)/2) {
		ends, failed := scanAll(chunks)
		if failed || !slices.Equal(ends, want) {
			t.Fatalf("split %d: ends = %v, failed %v; want %v", i, ends, failed, want)
		}
	}
	for _, bad := range []string{"x\r\n", "$abc\r\n", "*1\r\n?\r\n", "$" + strings.Repeat("1", 40) + "\r\n", "$?\r\n"} {
		if _, failed := scanAll([][]byte{[]byte(bad)}); !failed {
			t.Errorf("scan %q succeeded, want an error", bad)
		}
	}
}

func FuzzScanner(f *testing.F) {
	for _, fr := range scannerFrames {
		f.Add([]byte(fr), len(fr)/2)
	}
	f.Add([]byte(strings.Join(scannerFrames, "")), 7)
	f.Fuzz(func(t *testing.T, data []byte, k int) {
		// How the stream is cut into reads does not change where replies end.
		var first []int
		var firstFailed bool
		for i, chunks := range splits(data, k) {
			ends, failed := scanAll(chunks)
			if i == 0 {
				first, firstFailed = ends, failed
				continue
			}
			if failed != firstFailed || !slices.Equal(ends, first) {
				t.Fatalf("split %d: ends %v failed %v; whole: ends %v failed %v", i, ends, failed, first, firstFailed)
			}
		}
		for i := 1; i < len(first); i++ {
			if first[i] <= first[i-1] {
				t.Fatalf("ends %v not increasing", first)
			}
		}
	})
}

// parseAll feeds chunks to a request parser as reads and returns what it
// found, one line per command, and whether it failed.
func parseAll(chunks [][]byte) (found []string, failed bool) {
	r := newReqParser()
	for _, c := range chunks {
		r.buf = append(r.buf, c...)
		for {
			kind, cmd, err := r.next()
			if err != nil {
				return found, true
			}
			if kind == reqIncomplete {
				break
			}
			found = append(found, fmt.Sprintf("%d %q", kind, cmd))
		}
		r.compact()
	}
	return found, false
}

var requestStream = []struct {
	in   string
	want string // as parseAll prints it
}{
	{"*1\r\n$4\r\nping\r\n", `3 ["PING"]`},
	{"*3\r\n$3\r\nset\r\n$1\r\nk\r\n$2\r\nv1\r\n", `3 ["SET" "k" "v1"]`},
	{"*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n", `3 ["GET" "a\r\nb"]`},
	{"*1\r\n$0\r\n\r\n", `3 [""]`},
	{"PING\r\n", `2 []`},
	{"  \r\n", `1 []`},
	{"*0\r\n", `1 []`},
	{"*-1\r\n", `1 []`},
	{"*2\r\n$7\r\nevalsha\r\n$3\r\nabc\r\n", `3 ["EVALSHA" "abc"]`},
}

func TestReqParser(t *testing.T) {
	var stream []byte
	var want []string
	for _, r := range requestStream {
		stream = append(stream, r.in...)
		want = append(want, r.want)
	}
	for i, chunks := range splits(stream, len(stream)/3) {
		found, failed := parseAll(chunks)
		if failed || !slices.Equal(found, want) {
			t.Fatalf("split %d: found %q, failed %v; want %q", i, found, failed, want)
		}
	}
	for _, bad := range []string{"*1\r\n+PING\r\n", "*x\r\n", "*1\r\n$2\r\nabc\r\n", "*1\r\n$-1\r\n", "*" + strings.Repeat("1", 40)} {
		if _, failed := parseAll([][]byte{[]byte(bad)}); !failed {
			t.Errorf("parse %q succeeded, want an error", bad)
		}
	}
}

func FuzzReqParser(f *testing.F) {
	for _, r := range requestStream {
		f.Add([]byte(r.in), len(r.in)/2)
	}
	f.Fuzz(func(t *testing.T, data []byte, k int) {
		// How the stream is cut into reads does not change the commands.
		var first []string
		var firstFailed bool
		for i, chunks := range splits(data, k) {
			found, failed := parseAll(chunks)
			if i == 0 {
				first, firstFailed = found, failed
				continue
			}
			if failed != firstFailed || !slices.Equal(found, first) {
				t.Fatalf("split %d: %q failed %v; whole: %q failed %v", i, found, failed, first, firstFailed)
			}
		}
	})
}

// BenchmarkProxy measures INCR round trips through the proxy against the same
// server reached directly.
func BenchmarkProxy(b *testing.B) {
	s := Start(b, Options{})
	p := NewProxy(b, s.Addr)
	for _, bc := range []struct{ name, addr string }{{"direct", s.Addr}, {"proxy", p.Addr}} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			rdb := redis.NewClient(&redis.Options{Addr: bc.addr, MaxRetries: -1})
			defer rdb.Close()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := rdb.Incr(ctx, "n").Err(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cmds/s")
		})
	}
}
