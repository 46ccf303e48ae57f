package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestShardUnreachableAtStartIsCheckedLater: a shard that does not answer
// at start cannot have its durability read; rain serve starts, says so,
// and reads it once it answers: one that comes back on appendfsync
// everysec stops the instance under --durability strict, as it would
// have refused to start (API.md).
func TestShardUnreachableAtStartIsCheckedLater(t *testing.T) {
	good := redistest.Start(t, durable)
	weak := redistest.Start(t, redistest.Options{AOF: true, Fsync: "everysec"})
	cut := redisproxy.Start(t, weak.Addr)
	cut.Partition()
	logs := &logtest.Buffer{}
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + good.Addr + ",s2=1@" + cut.Addr, "RAIN_ADMIN_TOKEN": longToken,
		"RAIN_USER_AUTH": userAuthNone}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", "0", "--shard-timeout", "300ms"}, env(environ), &bytes.Buffer{}, logs)
	}()
	serving(t, logs, done)
	if !strings.Contains(logs.String(), "it is checked once it does") {
		t.Fatalf("rain serve did not say the unreachable shard's durability is checked later:\n%s", logs)
	}
	cut.Heal()
	var err error
	waittest.Until(t, 20*time.Second, "rain serve stopping once the shard answers on everysec", func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if err == nil || !strings.Contains(err.Error(), "stopping") || !strings.Contains(err.Error(), `appendfsync is "everysec"`) {
		t.Fatalf("rain serve returned %v once the weak shard answered; want it stopping, naming appendfsync everysec", err)
	}
}

// TestWeakShardFoundLaterIsRelaxed: under --durability relaxed, a shard
// that did not answer at start and comes back on appendfsync everysec is
// served, warned of, and shows in rain_durability_relaxed as one weak at
// start does (before, the gauge stayed 0: only the log said so).
func TestWeakShardFoundLaterIsRelaxed(t *testing.T) {
	good := redistest.Start(t, durable)
	weak := redistest.Start(t, redistest.Options{AOF: true, Fsync: "everysec"})
	cut := redisproxy.Start(t, weak.Addr)
	cut.Partition()
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + good.Addr + ",s2=1@" + cut.Addr, "RAIN_ADMIN_TOKEN": longToken}
	addr, logs := startServe(t, []string{"--shard-timeout", "300ms", "--durability", "relaxed"}, environ)
	if v := metricValue(t, addr, "rain_durability_relaxed"); v != 0 {
		t.Fatalf("rain_durability_relaxed = %v before the weak shard answers, want 0", v)
	}
	cut.Heal()
	waittest.Until(t, 20*time.Second, "rain_durability_relaxed 1 once the weak shard answers", func() bool {
		return metricValue(t, addr, "rain_durability_relaxed") == 1
	})
	if !strings.Contains(logs.String(), "durability relaxed") {
		t.Fatalf("the weak shard found later was not warned of:\n%s", logs)
	}
}

// TestShardUnreachableAtStartIsHeldUntilChecked: under strict, a shard
// that did not answer at start is sent no claim until its settings are
// read once it answers; a durable one is then served as any other.
func TestShardUnreachableAtStartIsHeldUntilChecked(t *testing.T) {
	servers := redistest.StartN(t, 2, durable)
	cut := redisproxy.Start(t, servers[1].Addr)
	cut.Partition()
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + servers[0].Addr + ",s2=1@" + cut.Addr, "RAIN_ADMIN_TOKEN": longToken}
	addr, logs := startServe(t, []string{"--shard-timeout", "300ms"}, environ)
	if !strings.Contains(logs.String(), "it is checked once it does") {
		t.Fatalf("rain serve did not say the unreachable shard's durability is checked later:\n%s", logs)
	}
	cut.Heal()
	waittest.Until(t, 20*time.Second, "the shard's durability read once it answers", func() bool {
		return strings.Contains(logs.String(), "shard durability checked now that it answers")
	})
	base := "http://" + addr
	if code, body := post(t, base+"/admin/pools", longToken, `{"pool_id":"late","total_cents":4000,"count":40,"sub_pools":2}`); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	_, status := get(t, base+"/admin/pools/late", longToken)
	if !strings.Contains(status, `"shard":"s2"`) {
		t.Fatalf("the pool has no sub-pool on s2: %s", status)
	}
	for i := range 40 {
		if code, body := post(t, base+"/grab", "", fmt.Sprintf(`{"pool_id":"late","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab of u%d once s2 is checked = %d %v, want 200", i, code, body)
		}
	}
}
