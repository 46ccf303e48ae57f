package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
)

// TestServeOutboxForm: rain serve writes each grant's outbox entry a field
// per value by default (what every rain settle pays), packed in one field
// with --outbox packed (RAIN_OUTBOX), a batch's grants in one entry of one
// field with --outbox batch, and refuses any other form as a usage error.
func TestServeOutboxForm(t *testing.T) {
	refusesForm(t, "--outbox", `want fields, packed or batch`)
	for _, form := range []string{"", "packed", "batch"} {
		addr, srv := serveInForm(t, "RAIN_OUTBOX", form, `{"pool_id":"o","total_cents":100,"count":1}`)
		if code, body := post(t, "http://"+addr+"/grab", "", `{"pool_id":"o","user_id":"u:1"}`); code != 200 || body["status"] != "granted" {
			t.Fatalf("grab = %d %v, want granted", code, body)
		}
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		entries, err := c.XRange(context.Background(), rain.SubPool{Pool: "o"}.Keys().Outbox, "-", "+").Result()
		if err != nil || len(entries) != 1 {
			t.Fatalf("outbox = %v, %v; want one entry", entries, err)
		}
		v := entries[0].Values
		got := fmt.Sprint(v["type"], " ", v["user"], " ", v["pool"])
		switch form {
		case "packed":
			if g, _ := v["g"].(string); len(v) != 1 || !strings.HasSuffix(g, ":u:1") {
				t.Errorf("--outbox packed: entry %v, want one field g ending in the user", v)
			}
		case "batch":
			if g, _ := v["G"].(string); len(v) != 1 || !strings.HasSuffix(g, ":u:1") {
				t.Errorf("--outbox batch: entry %v, want one field G ending in the user (a batch of one grant)", v)
			}
		default:
			if got != "grant u:1 o" {
				t.Errorf("default: entry %v, want a field per value (type grant, user u:1, pool o)", v)
			}
		}
	}
}

// TestServeDeadlineIndexForm: rain serve names each grant in the deadline
// index by a member of its own by default (what every earlier reaper
// releases), and the grants of a batch by one member of the batches key
// with --deadline-index batch (RAIN_DEADLINE_INDEX); any other form is a
// usage error. Grabs go in rounds of concurrent requests until a batch of
// several grants has been made (with batch), or for as many rounds (by
// default); then the reaper's index names every grant held, and by default
// the batches key was never written.
func TestServeDeadlineIndexForm(t *testing.T) {
	refusesForm(t, "--deadline-index", `want grant or batch`)
	for _, form := range []string{"", "batch"} {
		addr, srv := serveInForm(t, "RAIN_DEADLINE_INDEX", form, `{"pool_id":"d","total_cents":100000,"count":1000}`)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { c.Close() })
		ctx := context.Background()
		k := rain.SubPool{Pool: "d"}.Keys()
		granted := 0
		for round := 0; round < 20; round++ {
			var wg sync.WaitGroup
			var ok atomic.Int64
			for i := range 32 {
				wg.Go(func() {
					body := fmt.Sprintf(`{"pool_id":"d","user_id":"u%d.%d"}`, round, i)
					resp, err := http.Post("http://"+addr+"/grab", "application/json", strings.NewReader(body))
					if err == nil {
						if resp.StatusCode == 200 {
							ok.Add(1)
						}
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
			granted += int(ok.Load())
			if n, err := c.ZCard(ctx, k.Batches).Result(); err != nil || (form == "batch" && n > 0) {
				break
			}
		}
		alone, err := c.ZCard(ctx, k.Deadlines).Result()
		if err != nil {
			t.Fatal(err)
		}
		members, err := c.ZRange(ctx, k.Batches, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		named := int(alone)
		for _, m := range members {
			named += len(strings.Split(m, " "))
		}
		switch {
		case form == "" && len(members) > 0:
			t.Errorf("default: the batches key holds %v, want nothing (a member per grant)", members)
		case form == "batch" && len(members) == 0:
			t.Errorf("--deadline-index batch: no batch of several grants in 20 rounds of 32 concurrent grabs")
		case named != granted:
			t.Errorf("form %q: the deadline index names %d users (%d alone, batches %v), want the %d granted", form, named, alone, members, granted)
		}
	}
}

// refusesForm: rain serve refuses flag zip as a usage error saying what it
// wants.
func refusesForm(t *testing.T, flag, want string) {
	t.Helper()
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", flag, "zip"}, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), flag+` "zip": `+want) || exitCode(err) != exitUsage {
		t.Fatalf("serve %s zip = %v, want a usage error (%s)", flag, err, want)
	}
}

// serveInForm starts rain serve on a shard of its own with the environment
// variable name set to form (unset when ""), and preloads pool, a POST
// /admin/pools body; it returns the listener's address and the shard.
func serveInForm(t *testing.T, name, form, pool string) (string, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t, durable)
	environ := map[string]string{"RAIN_REDIS": "s1=1@" + srv.Addr, "RAIN_ADMIN_TOKEN": longToken}
	if form != "" {
		environ[name] = form
	}
	addr, _ := startServe(t, nil, environ)
	if code, body := post(t, "http://"+addr+"/admin/pools", longToken, pool); code != 201 {
		t.Fatalf("preload = %d %v", code, body)
	}
	return addr, srv
}
