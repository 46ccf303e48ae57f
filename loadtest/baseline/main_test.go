package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// TestShardedBaseline: with two Redis addresses, every user's grabs go to the
// shard its id hashes to, the stock is dealt out among the shards, and the
// pool's cents are granted once each: what a user is told again is what they
// were granted, and an empty shard answers sold out.
func TestShardedBaseline(t *testing.T) {
	a, b := redistest.Start(t, redistest.Options{}), redistest.Start(t, redistest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	var log logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-listen", "127.0.0.1:0", "-redis", a.Addr + "," + b.Addr, "-admin-token", "t"}, &log)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	listen := regexp.MustCompile(`listen=(\S+)`)
	var url string
	waittest.Until(t, 10*time.Second, "the baseline listening", func() bool {
		m := listen.FindStringSubmatch(log.String())
		if m != nil {
			url = "http://" + m[1]
		}
		return m != nil
	})
	post := func(path, auth, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, v
	}
	if code, v := post("/admin/pools", "t", `{"pool_id":"p","total_cents":10001,"count":101}`); code != 201 {
		t.Fatalf("preload = %d %v", code, v)
	}
	shards := []*redis.Client{redistest.Client(t, a), redistest.Client(t, b)}
	for i, c := range shards {
		if n := c.LLen(context.Background(), "bl:{p}:stock").Val(); n != int64(51-i) {
			t.Fatalf("shard %d holds %d amounts, want %d (dealt out in turn)", i, n, 51-i)
		}
	}
	granted, cents := 0, int64(0)
	amounts := map[string]float64{}
	for u := range 300 {
		user := fmt.Sprintf("u%d", u)
		code, v := post("/grab", "", `{"pool_id":"p","user_id":"`+user+`"}`)
		switch {
		case code == 200 && v["status"] == "granted":
			granted++
			cents += int64(v["amount_cents"].(float64))
			amounts[user] = v["amount_cents"].(float64)
			home := shards[xxhash.Sum64String(user)%2]
			if got := home.HGet(context.Background(), "bl:{p}:grants", user).Val(); got != fmt.Sprint(v["amount_cents"]) {
				t.Fatalf("%s granted %v, its shard records %q", user, v["amount_cents"], got)
			}
		case code == 410 && v["status"] == "sold_out":
		default:
			t.Fatalf("grab of %s = %d %v", user, code, v)
		}
	}
	if granted != 101 || cents != 10001 {
		t.Fatalf("granted %d amounts of %d cents in all, want the pool's 101 and 10001", granted, cents)
	}
	for user, amount := range amounts {
		if code, v := post("/grab", "", `{"pool_id":"p","user_id":"`+user+`"}`); code != 200 || v["status"] != "already_granted" || v["amount_cents"] != amount {
			t.Fatalf("grab of %s again = %d %v, want already_granted %v", user, code, v, amount)
		}
	}
}
