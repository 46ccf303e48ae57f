package chaos

import (
	"net/http/httptest"
	"testing"
	"time"

	"rain/internal/api"
	"rain/internal/auth"
	"rain/internal/instance"
	"rain/internal/pool"
	"rain/internal/reaper"
	"rain/internal/shard"
)

// adminToken is the chaos instances' operator token.
const adminToken = "chaos-admin-token"

// startInstance is one rain serve on specs, built by instance.New as rain
// serve builds it (the worker pool at its defaults, the shards with rain
// serve's client options, go-redis's retries included, the first shard
// listed the serial shard), its background work running (local answers,
// reaper, timeline), and its API on an HTTP test server. tweak, when not nil, changes the config
// first. Everything stops when the test ends.
func startInstance(t *testing.T, specs []shard.Spec, tweak func(*instance.Config)) (*instance.Instance, *httptest.Server) {
	t.Helper()
	admins, err := auth.NewAdmins(adminToken, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := instance.Config{Shards: specs, Pool: &pool.Config{}, API: api.Config{Admins: admins},
		ReaperRetry: 200 * time.Millisecond, Reaper: reaper.Config{Interval: 100 * time.Millisecond}}
	if tweak != nil {
		tweak(&cfg)
	}
	in, err := instance.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.Start()
	ts := httptest.NewServer(in.API)
	t.Cleanup(func() {
		ts.Close()
		if err := in.Close(5 * time.Second); err != nil {
			t.Errorf("instance close: %v", err)
		}
	})
	return in, ts
}
