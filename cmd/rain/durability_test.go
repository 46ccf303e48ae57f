package main

import (
	"bytes"
	"context"
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
