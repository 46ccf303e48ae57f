package redistest

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartNDistinct(t *testing.T) {
	servers := StartN(t, 3, Options{})
	seen := map[string]bool{}
	for _, s := range Addrs(servers) {
		if seen[s] {
			t.Fatalf("StartN gave address %s twice", s)
		}
		seen[s] = true
		if err := ping(s); err != nil {
			t.Fatalf("ping %s: %v", s, err)
		}
	}
}

func TestKillRestartKeepsAOF(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{AOF: true, Fsync: "always"})
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Kill()
	if err := ping(s.Addr); err == nil {
		t.Fatalf("ping %s after Kill succeeded, want an error", s.Addr)
	}
	if err := rdb.Get(ctx, "k").Err(); err == nil {
		t.Fatal("GET on a killed server succeeded")
	}
	s.Kill() // killing a dead server is a no-op

	addr := s.Addr
	s.Restart()
	if s.Addr != addr {
		t.Fatalf("Restart moved the server from %s to %s", addr, s.Addr)
	}
	got, err := rdb.Get(ctx, "k").Result()
	if err != nil || got != "v1" {
		t.Fatalf("GET k after restart = %q, %v; want v1 (fsync always)", got, err)
	}
}

func TestNoAOFLosesData(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{})
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer rdb.Close()
	if err := rdb.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart()
	if err := rdb.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after restart without AOF: err = %v, want redis.Nil", err)
	}
}
