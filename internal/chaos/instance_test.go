package chaos

import (
	"context"
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
// reaper, timeline), and its API on its own listener on a free port, as
// rain serve serves it; base is the listener's URL. tweak, when not nil,
// changes the config first. Everything stops when the test ends.
func startInstance(t *testing.T, specs []shard.Spec, tweak func(*instance.Config)) (in *instance.Instance, base string) {
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
	in, err = instance.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.API.Listen("127.0.0.1:0"); err != nil {
		_ = in.Close(5 * time.Second)
		t.Fatal(err)
	}
	in.Start()
	served := make(chan error, 1)
	go func() { served <- in.API.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := in.API.Shutdown(ctx); err != nil {
			t.Errorf("API shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("API serve: %v", err)
		}
		if err := in.Close(5 * time.Second); err != nil {
			t.Errorf("instance close: %v", err)
		}
	})
	return in, "http://" + in.API.Addr().String()
}
