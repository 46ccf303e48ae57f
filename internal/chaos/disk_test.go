package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
)

// TestBusyDiskRefusesNothing: four healthy shards on appendfsync always,
// a flood of grabs, and beside them a disk kept busy with synchronous
// writes (as `dd oflag=dsync` does), so that the shards' fsyncs land
// late now and then. No shard fails: not one grab may be answered 503
// (invariant 10: a shard that answers, however slowly its fsync lands,
// serves its users).
func TestBusyDiskRefusesNothing(t *testing.T) {
	window := 3 * time.Second
	if os.Getenv("RAIN_CHAOS") == "full" {
		window = 15 * time.Second
	}
	ctx := context.Background()
	servers := redistest.StartN(t, 4, durable)
	specs := shardtest.Specs(redistest.Addrs(servers))
	in, base := startInstance(t, specs, nil)
	if _, _, err := in.Catalog.Preload(ctx, rain.Spec{PoolID: "disk", TotalCents: 100_000_000, Count: 1_000_000, SubPools: 4}); err != nil {
		t.Fatal(err)
	}

	// The busy disk: synchronous 1 MiB writes in the shards' file system.
	stopDisk := make(chan struct{})
	var disk sync.WaitGroup
	var written atomic.Int64
	disk.Go(func() {
		f, err := os.OpenFile(filepath.Join(t.TempDir(), "busy"), os.O_CREATE|os.O_WRONLY|os.O_SYNC, 0o600)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		buf := make([]byte, 1<<20)
		for i := 0; ; i++ {
			select {
			case <-stopDisk:
				return
			default:
			}
			if i%64 == 0 {
				_, _ = f.Seek(0, 0)
			}
			if _, err := f.Write(buf); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
		}
	})
	defer func() { close(stopDisk); disk.Wait() }()

	const clients = 48
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	var answered, granted atomic.Int64
	var mu sync.Mutex
	refused := map[string]int{}
	end := time.Now().Add(window)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for n := 0; time.Now().Before(end); n++ {
				body := fmt.Sprintf(`{"pool_id":"disk","user_id":"c%d-%d"}`, c, n)
				resp, err := client.Post(base+"/grab", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("grab: %v", err)
					return
				}
				var ans struct{ Status, Error string }
				err = json.NewDecoder(resp.Body).Decode(&ans)
				resp.Body.Close()
				if err != nil {
					t.Errorf("grab answer: %v", err)
					return
				}
				answered.Add(1)
				if resp.StatusCode == http.StatusOK {
					granted.Add(1)
					continue
				}
				mu.Lock()
				refused[fmt.Sprintf("%d %s: %s", resp.StatusCode, ans.Status, ans.Error)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d grabs answered, %d granted, with %d MiB written synchronously beside the shards", answered.Load(), granted.Load(), written.Load())
	for what, n := range refused {
		t.Errorf("%d grabs answered %s", n, what)
	}
	for _, st := range in.Grabs.ShardStats() {
		if st.Busy > 0 || st.Refused > 0 || st.Trips > 0 {
			t.Errorf("shard %s: %+v, want no claim refused and no breaker trip", st.Name, st)
		}
	}
}
