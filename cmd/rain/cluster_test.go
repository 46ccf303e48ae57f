package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestToolsOnACluster: every command on a pool whose shard is a Redis
// Cluster of three primaries: rain serve, rain preload, grabs, /metrics
// per primary, rain audit, rain settle, rain end and rain close; then a
// primary (without a replica) dies, and /readyz names it.
func TestToolsOnACluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0, durable)
	environ := map[string]string{"RAIN_REDIS": "c1=1@cluster/" + cl.Seeds(), "RAIN_ADMIN_TOKEN": longToken}
	addr, _ := startServe(t, nil, environ)
	tool := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, env(environ), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	if out, err := tool("preload", "--pool", "cp", "--total-cents", "3000", "--count", "30", "--sub-pools", "3"); err != nil || !strings.Contains(out, `"remaining_count": 30`) {
		t.Fatalf("rain preload = %q, %v", out, err)
	}
	for i := range 12 {
		if code, body := post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"cp","user_id":"u%d"}`, i)); code != 200 {
			t.Fatalf("grab = %d %v", code, body)
		}
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, n := range cl.Nodes {
		if !bytes.Contains(b, []byte(`shard="c1/`+n.Addr+`"`)) {
			t.Errorf("/metrics names no series of primary c1/%s", n.Addr)
		}
	}
	if out, err := tool("audit", "--pool", "cp"); err != nil || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("rain audit = %q, %v", out, err)
	}
	if out, err := tool("end", "--pool", "cp"); err != nil || !strings.Contains(out, `"state": "ended"`) {
		t.Fatalf("rain end = %q, %v", out, err)
	}
	ledger := t.TempDir() + "/ledger.jsonl"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"settle", "--ledger", ledger, "--consumer", "t1"}, env(environ), &bytes.Buffer{}, &logtest.Buffer{})
	}()
	t.Cleanup(cancel)
	var out string
	waittest.Until(t, 20*time.Second, "rain close succeeds once rain settle has delivered every grant", func() bool {
		out, err = tool("close", "--pool", "cp")
		return err == nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("rain settle returned %v after cancel", err)
	}
	var a map[string]any
	if err := json.Unmarshal([]byte(out), &a); err != nil || a["state"] != "closed" || a["confirmed_count"] != float64(12) || a["unclaimed_count"] != float64(18) {
		t.Fatalf("rain close printed %q (%v); want the account, 12 confirmed and 18 unclaimed", out, err)
	}
	if l, _ := os.ReadFile(ledger); bytes.Count(l, []byte("\n")) != 12 {
		t.Fatalf("the ledger holds %d lines, want 12", bytes.Count(l, []byte("\n")))
	}

	// A pool in the window, then a primary dies: the shard is in use.
	if _, err := tool("preload", "--pool", "live", "--total-cents", "3000", "--count", "30", "--sub-pools", "3"); err != nil {
		t.Fatalf("rain preload: %v", err)
	}
	dead := cl.Nodes[1]
	dead.Kill()
	waittest.Until(t, 20*time.Second, "/readyz naming the dead primary", func() bool {
		req, _ := http.NewRequest("GET", "http://"+addr+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+longToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 503 && bytes.Contains(b, []byte("c1/"+dead.Addr))
	})
	// Grabs of its users open its breaker, and the dashboard's timeline
	// names the primary.
	i := 0
	waittest.Until(t, 20*time.Second, "the dashboard's timeline naming the dead primary's open breaker", func() bool {
		for range 10 {
			i++
			post(t, "http://"+addr+"/grab", "", fmt.Sprintf(`{"pool_id":"live","user_id":"v%d"}`, i))
		}
		req, _ := http.NewRequest("GET", "http://"+addr+"/admin/stats", nil)
		req.Header.Set("Authorization", "Bearer "+longToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Points []struct {
				BreakersOpen []string `json:"breakers_open"`
			} `json:"points"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || len(st.Points) == 0 {
			return false
		}
		return slices.Contains(st.Points[len(st.Points)-1].BreakersOpen, "c1/"+dead.Addr)
	})
}

// TestClusterRefusals: a cluster/ shard that is a standalone server, and a
// cluster one of whose primaries does not fsync every write, are refused
// at start with a message naming them (the second allowed with
// --durability relaxed).
func TestClusterRefusals(t *testing.T) {
	alone := redistest.Start(t, durable)
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "none",
		"--redis", "c1=1@cluster/" + alone.Addr}, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if exitCode(err) != exitUsage || !strings.Contains(err.Error(), "shard c1") || !strings.Contains(err.Error(), "Redis Cluster") {
		t.Errorf("serve on a standalone server given as a cluster = %v (exit %d), want a usage error naming c1", err, exitCode(err))
	}
	weak := redistest.StartCluster(t, 3, 0, redistest.Options{AOF: true, Fsync: "everysec"})
	shards := "c1=1@cluster/" + weak.Seeds()
	for _, cmd := range [][]string{
		{"serve", "--listen", "127.0.0.1:0", "--admin-token", longToken, "--user-auth", "none"},
		{"settle", "--ledger", t.TempDir() + "/l"},
	} {
		err := run(context.Background(), append(cmd, "--redis", shards), env(nil), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil {
			t.Fatalf("rain %s on a cluster of everysec primaries started, want a refusal", cmd[0])
		}
		for _, n := range weak.Nodes {
			if want := "shard c1/" + n.Addr + `: appendfsync is "everysec"`; !strings.Contains(err.Error(), want) {
				t.Errorf("rain %s refused with %q, want it to say %q", cmd[0], err, want)
			}
		}
	}
	startServe(t, []string{"--durability", "relaxed"}, map[string]string{"RAIN_REDIS": shards, "RAIN_ADMIN_TOKEN": longToken})
}
