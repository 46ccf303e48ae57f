package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
	"rain/internal/wait/waittest"
)

var (
	binOnce sync.Once
	binDir  string // removed when the tests end (TestMain)
	binPath string
	binErr  error
)

// rainBinary builds rain once per test run, for tests that need a rain
// process of its own (to stop it with SIGSTOP, or kill it).
func rainBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "rain-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "rain")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// TestStalledPreloadCannotReopen: a rain preload frozen (SIGSTOP, as a VM
// pause) after it wrote the pool's record, while the same pool is
// preloaded by another, grabbed, ended, settled and closed, then thawed:
// it creates nothing (no sub-pool, no stock), the pool stays closed with
// its account, and the stalled preload exits saying its pool was closed.
func TestStalledPreloadCannotReopen(t *testing.T) {
	bin := rainBinary(t)
	servers := redistest.StartN(t, 2, durable)
	clients := redistest.Clients(t, servers)
	shards := shardtest.Flag(redistest.Addrs(servers))
	environ := map[string]string{"RAIN_REDIS": shards, "RAIN_ADMIN_TOKEN": longToken}
	spec := []string{"preload", "--pool", "big", "--total-cents", "200000000", "--count", "2000000", "--sub-pools", "2"}
	ctx := context.Background()

	var stderr bytes.Buffer
	stalled := exec.Command(bin, spec...)
	stalled.Env = []string{"RAIN_REDIS=" + shards}
	stalled.Stderr = &stderr
	if err := stalled.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = stalled.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = stalled.Process.Signal(syscall.SIGCONT)
		_ = stalled.Process.Kill()
		<-exited
	})
	// Frozen as soon as its record is written: before the sub-pools are
	// set up (the split of 2,000,000 amounts comes first), or while they load.
	waittest.Until(t, 20*time.Second, "the stalled preload wrote the pool's record", func() bool {
		n, err := clients[0].Exists(ctx, "rain:{big}:pool").Result()
		return err == nil && n == 1
	})
	if err := stalled.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	metas := 0
	for _, c := range clients {
		n, _ := c.Exists(ctx, "rain:{big:0}:meta", "rain:{big:1}:meta").Result()
		metas += int(n)
	}
	t.Logf("frozen with %d of the sub-pools set up", metas)

	other := exec.Command(bin, spec...)
	other.Env = stalled.Env
	if out, err := other.CombinedOutput(); err != nil {
		t.Fatalf("the other preload: %v\n%s", err, out)
	}
	addr, _ := startServe(t, nil, environ)
	for i := range 5 {
		if code, body := post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"big","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d %v", code, body)
		}
	}
	tool := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, args, env(environ), &out, &errOut)
		return out.String(), err
	}
	if _, err := tool("end", "--pool", "big"); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(sctx, []string{"settle", "--ledger", filepath.Join(t.TempDir(), "ledger.jsonl")}, env(environ), &bytes.Buffer{}, &logtest.Buffer{})
	}()
	waittest.Until(t, 30*time.Second, "the pool closes once its grants are settled", func() bool {
		_, err := tool("close", "--pool", "big")
		return err == nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("rain settle: %v", err)
	}

	if err := stalled.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatal("the thawed preload did not exit within 60s")
	}
	var ee *exec.ExitError
	if err := waitErr; !errors.As(err, &ee) || ee.ExitCode() != exitFailed || !strings.Contains(stderr.String(), "closed") {
		t.Fatalf("the thawed preload exited %v, saying %q; want exit 1, its pool closed", err, stderr.String())
	}
	out, err := tool("audit", "--pool", "big")
	if err != nil || !strings.Contains(out, "closed") {
		t.Fatalf("audit after the thaw = %q, %v; want the closed pool's account", out, err)
	}
	for i, c := range clients {
		if st, _ := c.HGet(ctx, "rain:{big}:pool", "state").Result(); st != "closed" {
			t.Errorf("shard %d: the record's state is %q after the thaw, want closed", i, st)
		}
		keys, _ := c.Keys(ctx, "rain:{big:*").Result()
		for _, k := range keys {
			if !strings.HasSuffix(k, ":meta") {
				t.Errorf("shard %d holds %s after the thaw: the closed pool was loaded again", i, k)
			} else if st, _ := c.HGet(ctx, k, "state").Result(); st != "closed" {
				t.Errorf("shard %d: %s is %q after the thaw, want the closed tombstone", i, k, st)
			}
		}
	}
}
