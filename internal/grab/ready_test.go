package grab

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"

	"rain/internal/catalog"
	"rain/internal/redistest"
	"rain/internal/shard/shardtest"
)

// TestReadyOutOfDescriptors: with the process out of file descriptors,
// /readyz's check says so and does not blame the shards it cannot reach:
// not ready, Process "out of file descriptors", no shard "down". The
// process's own limit is lowered for the test, and restored.
func TestReadyOutOfDescriptors(t *testing.T) {
	_, set := shardtest.Start(t, 2, redistest.Options{}) // no call has used it: its pings must dial
	svc := New(Config{Shards: set, Pools: catalog.New(set, catalog.Config{})})
	t.Cleanup(svc.Close)

	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	lim := orig
	lim.Cur = uint64(len(fds)) + 16
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var held []*os.File
	release := func() {
		for _, f := range held {
			f.Close()
		}
		held = nil
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
			t.Fatal(err)
		}
	}
	defer release()
	for {
		f, err := os.Open(os.DevNull)
		if errors.Is(err, syscall.EMFILE) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
	}
	rd := svc.Ready(context.Background())
	release()
	if rd.Ready || rd.Process != ProcessOutOfFDs {
		t.Fatalf("Ready out of descriptors = %+v, want not ready, process %q", rd, ProcessOutOfFDs)
	}
	for _, st := range rd.Shards {
		if st.State != ShardUnknown || !strings.Contains(st.Error, "file descriptors") {
			t.Fatalf("shard %s: %+v, want %s (this process's fault, not the shard's)", st.Name, st, ShardUnknown)
		}
	}
	if rd := svc.Ready(context.Background()); !rd.Ready || rd.Process != "" {
		t.Fatalf("Ready with descriptors again = %+v, want ready", rd)
	}
}
