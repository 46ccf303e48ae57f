package redisproxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"rain/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clients returns a client through the proxy with go-redis's default
// retries (as rain runs), one with none, and one straight to Redis.
func clients(t *testing.T) (p *Proxy, retrying, once, direct *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	p = Start(t, srv.Addr)
	mk := func(addr string, retries int) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, MaxRetries: retries})
		t.Cleanup(func() { c.Close() })
		return c
	}
	return p, mk(p.Addr, 0), mk(p.Addr, -1), mk(srv.Addr, -1)
}

// A swallowed reply: the command ran at Redis. With retries, go-redis sends
// it again, so a non-idempotent INCR runs twice; without, the caller gets
// an error though the command ran.
func TestDropReplies(t *testing.T) {
	ctx := context.Background()
	p, retrying, once, direct := clients(t)
	p.DropReplies(Command("incr"), 1)
	if n, err := retrying.Incr(ctx, "a").Result(); err != nil || n != 2 {
		t.Fatalf("INCR with retries after a lost reply = %d, %v; want 2: it ran, was sent again and ran again", n, err)
	}
	p.DropReplies(Command("incr"), 1)
	if _, err := once.Incr(ctx, "b").Result(); err == nil {
		t.Fatal("INCR without retries after a lost reply succeeded, want an error")
	}
	if n, err := direct.Get(ctx, "b").Int(); err != nil || n != 1 {
		t.Fatalf("b = %d, %v; want 1: the INCR whose reply was lost ran", n, err)
	}
	if st := p.Stats(); st.RepliesSwallowed["INCR"] != 2 {
		t.Fatalf("stats %+v, want 2 INCR replies swallowed", st)
	}
}

// A dropped request never ran.
func TestDropRequests(t *testing.T) {
	ctx := context.Background()
	p, _, once, direct := clients(t)
	p.DropRequests(Command("set"), 1)
	if err := once.Set(ctx, "k", "v", 0).Err(); err == nil {
		t.Fatal("SET dropped before Redis succeeded, want an error")
	}
	if n, err := direct.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS k = %d, %v; want 0: the dropped SET never ran", n, err)
	}
	if err := once.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET after the drop = %v, want it through", err)
	}
}

// A pipeline whose fifth reply is lost: the commands before it ran, the
// caller gets errors, and with retries the whole pipeline is sent again.
func TestPipelineReplyLost(t *testing.T) {
	ctx := context.Background()
	p, retrying, once, direct := clients(t)
	key := func(i int) string { return fmt.Sprintf("k%d", i) }
	fifth := func(cmd []string) bool { return cmd[0] == "INCR" && cmd[1] == key(4) }

	p.DropReplies(fifth, 1)
	pipe := once.Pipeline()
	for i := range 10 {
		pipe.Incr(ctx, key(i))
	}
	if _, err := pipe.Exec(ctx); err == nil {
		t.Fatal("pipeline with a lost reply succeeded without retries, want an error")
	}
	for i := range 5 {
		if n, _ := direct.Get(ctx, key(i)).Int(); n != 1 {
			t.Fatalf("%s = %d after the lost reply, want 1: it ran before the loss", key(i), n)
		}
	}
	// Commands 6-10 were written before the loss too: Redis ran them (the
	// reset came after their bytes reached it).
	time.Sleep(50 * time.Millisecond)
	ran := 0
	for i := 5; i < 10; i++ {
		if n, _ := direct.Get(ctx, key(i)).Int(); n == 1 {
			ran++
		}
	}
	t.Logf("commands after the lost reply that ran anyway: %d of 5", ran)

	p.DropReplies(fifth, 1)
	pipe = retrying.Pipeline()
	cmds := make([]*redis.IntCmd, 10)
	for i := range 10 {
		cmds[i] = pipe.Incr(ctx, key(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatalf("pipeline with retries = %v, want through", err)
	}
	// Sent whole again: the first five ran twice.
	if n := cmds[0].Val(); n != 3 {
		t.Fatalf("first INCR of the retried pipeline answered %d, want 3 (1 before, 2 runs now)", n)
	}
}

// Random loss: every call through a retrying client succeeds or fails;
// the counter is at least the successes, and replies were swallowed.
func TestReplyLoss(t *testing.T) {
	ctx := context.Background()
	p, retrying, _, direct := clients(t)
	p.SetReplyLoss(0.05, 7)
	ok := 0
	for range 500 {
		if err := retrying.Incr(ctx, "n").Err(); err == nil {
			ok++
		}
	}
	p.SetReplyLoss(0, 0)
	n, err := direct.Get(ctx, "n").Int()
	if err != nil || n < ok {
		t.Fatalf("counter %d (%v) after %d successful INCRs, want at least that many", n, err, ok)
	}
	if sw := p.Stats().Swallowed(); sw == 0 {
		t.Fatal("no reply swallowed at 5% loss")
	} else {
		t.Logf("%d replies swallowed, %d successes, counter %d: %d INCRs ran twice", sw, ok, n, n-ok)
	}
}

// EVALSHA is matched by the script's SHA1; the recorded exchange holds the
// swallowed reply, and the re-sent script's reply beside it.
func TestScriptAndRecord(t *testing.T) {
	ctx := context.Background()
	p, retrying, _, _ := clients(t)
	s := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
	if err := s.Load(ctx, retrying).Err(); err != nil {
		t.Fatal(err)
	}
	p.Record()
	p.DropReplies(Script(s.Hash()), 1)
	if n, err := s.Run(ctx, retrying, []string{"x"}).Int(); err != nil || n != 2 {
		t.Fatalf("script after a lost reply = %d, %v; want 2", n, err)
	}
	var got []string
	for _, e := range p.Exchanges() {
		if e.Cmd[0] == "EVALSHA" {
			got = append(got, fmt.Sprintf("%s swallowed=%v", e.Reply, e.Swallowed))
		}
	}
	if want := []string{":1\r\n swallowed=true", ":2\r\n swallowed=false"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("exchanges %q, want %q", got, want)
	}
}

// Pub/sub passes through: a subscriber through the proxy gets messages.
func TestPubSubPassesThrough(t *testing.T) {
	ctx := context.Background()
	_, retrying, _, direct := clients(t)
	ps := retrying.Subscribe(ctx, "ch")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if err := direct.Publish(ctx, "ch", "hello").Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := ps.ReceiveMessage(rctx)
	if err != nil || m.Payload != "hello" {
		t.Fatalf("message = %v, %v; want hello", m, err)
	}
}

// ResetConns breaks every connection; go-redis reconnects.
func TestResetConns(t *testing.T) {
	ctx := context.Background()
	p, retrying, _, _ := clients(t)
	if err := retrying.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.ResetConns()
	if err := retrying.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after a reset = %v, want through (go-redis retries on a fresh connection)", err)
	}
}

// A partition after a command: the command ran, its reply never comes, and
// nothing sent after it reaches Redis, on any connection, until Heal; the
// trigger's then runs at that moment (a second proxy cut with it).
func TestPartitionAfter(t *testing.T) {
	ctx := context.Background()
	p, retrying, _, direct := clients(t)
	srv2 := redistest.Start(t, redistest.Options{})
	p2 := Start(t, srv2.Addr)
	other := redis.NewClient(&redis.Options{Addr: p2.Addr, Protocol: 2})
	t.Cleanup(func() { other.Close() })
	p.PartitionAfter(Command("incr"), 2, p2.Partition)
	if err := retrying.Incr(ctx, "n").Err(); err != nil {
		t.Fatalf("the first INCR = %v, want it through (the cut is on the second)", err)
	}
	if err := retrying.Incr(ctx, "n").Err(); err == nil {
		t.Fatal("the INCR the partition follows succeeded, want its reply lost")
	}
	if !p.Partitioned() || !p2.Partitioned() {
		t.Fatalf("partitioned %v and %v, want both (the trigger's then)", p.Partitioned(), p2.Partitioned())
	}
	if err := retrying.Set(ctx, "after", "x", 0).Err(); err == nil {
		t.Fatal("a SET through the partition succeeded")
	}
	if err := other.Ping(ctx).Err(); err == nil {
		t.Fatal("a PING through the second, partitioned proxy succeeded")
	}
	if n, err := direct.Get(ctx, "n").Int(); err != nil || n != 2 {
		t.Fatalf("n = %d, %v; want 2: the INCR the partition follows ran, its retries did not", n, err)
	}
	if n, err := direct.Exists(ctx, "after").Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS after = %d, %v; want 0: nothing passes a partition", n, err)
	}
	p.Heal()
	if err := retrying.Set(ctx, "after", "x", 0).Err(); err != nil {
		t.Fatalf("SET after Heal = %v, want it through", err)
	}
}
