package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
)

// TestServeOutboxForm: rain serve writes each grant's outbox entry a field
// per value by default (what every rain settle pays), packed in one field
// with --outbox packed (RAIN_OUTBOX), and refuses any other form as a
// usage error.
func TestServeOutboxForm(t *testing.T) {
	err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--outbox", "zip"}, env(nil), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `--outbox "zip": want fields or packed`) || exitCode(err) != exitUsage {
		t.Fatalf("serve --outbox zip = %v, want a usage error", err)
	}
	for _, form := range []string{"", "packed"} {
		srv := redistest.Start(t, durable)
		environ := map[string]string{"RAIN_REDIS": "s1=1@" + srv.Addr, "RAIN_ADMIN_TOKEN": longToken}
		if form != "" {
			environ["RAIN_OUTBOX"] = form
		}
		addr, _ := startServe(t, nil, environ)
		if code, body := post(t, "http://"+addr+"/admin/pools", longToken, `{"pool_id":"o","total_cents":100,"count":1}`); code != 201 {
			t.Fatalf("preload = %d %v", code, body)
		}
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
		if form == "packed" {
			if g, _ := v["g"].(string); len(v) != 1 || !strings.HasSuffix(g, ":u:1") {
				t.Errorf("--outbox packed: entry %v, want one field g ending in the user", v)
			}
		} else if got != "grant u:1 o" {
			t.Errorf("default: entry %v, want a field per value (type grant, user u:1, pool o)", v)
		}
	}
}
