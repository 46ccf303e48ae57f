package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"rain/internal/shard"
	"strings"
	"testing"
	"time"

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
	rdb := shard.NewClient(s.Addr, shard.Options{}) // rain serve's client, retries included
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
	rdb := shard.NewClient(s.Addr, shard.Options{}) // rain serve's client, retries included
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

func TestPauseResume(t *testing.T) {
	s := Start(t, Options{})
	rdb := shard.NewClient(s.Addr, shard.Options{}) // rain serve's options, retries included
	defer rdb.Close()
	ping := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return rdb.Ping(ctx).Err()
	}
	if err := ping(); err != nil {
		t.Fatalf("PING before Pause: %v", err)
	}

	s.Pause()
	// The PING fails by its own timeout while the server stays paused.
	pinged := make(chan error, 1)
	go func() { pinged <- ping() }()
	select {
	case err := <-pinged:
		if err == nil {
			t.Fatal("PING of a paused server succeeded")
		}
	case <-time.After(time.Minute):
		t.Fatal("PING of a paused server did not end within a minute, past its 200ms timeout")
	}
	if pid := s.PID(); pid == 0 {
		t.Fatal("PID of a paused server = 0")
	} else if state := procState(t, pid); state != "T" {
		t.Fatalf("process %d is in state %q while paused, want T (stopped)", pid, state)
	}

	s.Resume()
	if err := ping(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

// procState returns the state letter of process pid from /proc (R, S, T, ...).
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...; comm may hold spaces, so cut after the last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return fields[0]
}

func TestKillPausedServer(t *testing.T) {
	s := Start(t, Options{AOF: true, Fsync: "always"})
	s.Pause()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Kill()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Kill of a paused server did not return within 10s")
	}
	if pid := s.PID(); pid != 0 {
		t.Fatalf("PID after Kill = %d, want 0", pid)
	}
	s.Restart()
	if err := ping(s.Addr); err != nil {
		t.Fatalf("ping after Restart: %v", err)
	}
	// The cleanup's Kill of a server left paused must not hang either.
	s.Pause()
}

func TestSnapshotRestoreAOF(t *testing.T) {
	ctx := context.Background()
	s := Start(t, Options{AOF: true, Fsync: "always"})
	rdb := shard.NewClient(s.Addr, shard.Options{}) // rain serve's client, retries included
	defer rdb.Close()
	if err := rdb.Set(ctx, "a", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	snap := s.SnapshotAOF()
	if err := rdb.Set(ctx, "b", "2", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Kill()
	s.RestoreAOF(snap)
	s.Restart()
	if got, err := rdb.Get(ctx, "a").Result(); err != nil || got != "1" {
		t.Fatalf("GET a after restore = %q, %v; want 1 (in the snapshot)", got, err)
	}
	if got, err := rdb.Get(ctx, "b").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET b after restore = %q, %v; want redis.Nil (written after the snapshot)", got, err)
	}

	// The snapshot is a copy: restoring it twice gives the same state, and
	// what the restored server writes does not change it.
	if err := rdb.Set(ctx, "c", "3", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.RestoreAOF(snap)
	s.Restart()
	if n, err := rdb.Exists(ctx, "a", "b", "c").Result(); err != nil || n != 1 {
		t.Fatalf("EXISTS a b c after the second restore = %d, %v; want 1", n, err)
	}
}
