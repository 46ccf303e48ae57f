package lua

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"rain/internal/wait/waittest"
)

// TestParseOutboxEntry reads both forms of an outbox entry: the packed one
// the scripts write (a user id may hold ':') and the field-per-value one
// rain wrote before, which an outbox may still hold after an upgrade.
func TestParseOutboxEntry(t *testing.T) {
	for _, c := range []struct {
		name string
		v    map[string]any
		want OutboxEntry
	}{
		{"grant", map[string]any{"g": "250:17:1790000000000:u:1"},
			OutboxEntry{User: "u:1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000}},
		{"adopted grant, fields", map[string]any{"type": "grant", "pool": "p", "sub": "1", "user": "u1", "amount": "250",
			"serial": "17", "deadline_ms": "1790000000000", "origin": "3"},
			OutboxEntry{User: "u1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000, Origin: "3", Pool: "p", Sub: 1}},
		{"release", map[string]any{"r": "250:17:1790000000000:u1"},
			OutboxEntry{Release: true, User: "u1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000}},
		{"grant, fields", map[string]any{"type": "grant", "pool": "p", "sub": "2", "user": "u1", "amount": "250",
			"serial": "17", "deadline_ms": "1790000000000"},
			OutboxEntry{User: "u1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000, Pool: "p", Sub: 2}},
		{"release, fields", map[string]any{"type": "release", "pool": "p", "sub": "0", "user": "u1", "amount": "250",
			"serial": "17", "deadline_ms": "1790000000000"},
			OutboxEntry{Release: true, User: "u1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000, Pool: "p"}},
	} {
		got, err := ParseOutboxEntry(c.v)
		if err != nil || got != c.want {
			t.Errorf("%s: ParseOutboxEntry(%v) = %+v, %v; want %+v", c.name, c.v, got, err, c.want)
		}
	}
	for _, v := range []map[string]any{
		{},
		{"g": ""},
		{"g": "250:17:1790000000000"},
		{"g": "250:17:1790000000000:"},
		{"g": "x:17:1790000000000:u1"},
		{"r": "250:-:1790000000000:u1"},
		{"r": "damaged"},
		{"type": "release", "pool": "p", "sub": "0", "user": "u1", "amount": "x", "serial": "1", "deadline_ms": "1"},
		{"type": "grant", "pool": "p", "sub": "x", "user": "u1", "amount": "1", "serial": "1", "deadline_ms": "1"},
		{"type": "grant", "pool": "p", "sub": "0", "user": "u1", "amount": "1", "serial": "1"},
		{"type": "other"},
	} {
		got, err := ParseOutboxEntry(v)
		if err == nil {
			t.Errorf("ParseOutboxEntry(%v) = %+v, nil; want an error", v, got)
		}
		if _, r := v["r"]; got.Release != (r || v["type"] == "release") {
			t.Errorf("ParseOutboxEntry(%v) = %+v: an unreadable release is still one, nothing else is", v, got)
		}
	}
}

// FuzzParseOutboxEntry: any packed value is read or refused, never a
// panic, and one read is a grant whose user is all after the third ':'.
func FuzzParseOutboxEntry(f *testing.F) {
	f.Add("250:17:1790000000000:u1")
	f.Add("1:2:3:a:b:c")
	f.Add(":::")
	f.Fuzz(func(t *testing.T, packed string) {
		e, err := ParseOutboxEntry(map[string]any{"g": packed})
		if err != nil {
			return
		}
		if e.Release || e.User == "" || !strings.HasSuffix(packed, ":"+e.User) || strings.Count(packed, ":")-strings.Count(e.User, ":") != 3 {
			t.Fatalf("ParseOutboxEntry(%q) = %+v", packed, e)
		}
	})
}

// TestClaimWritesTheOutboxFormAsked: claim_many writes a grant's entry
// packed when asked, and a field per value otherwise (what a rain settle
// older than the packed form pays: type grant, pool, sub, user, amount,
// serial, deadline_ms).
func TestClaimWritesTheOutboxFormAsked(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 1, 5000, 10, 20)
	for i, packed := range []bool{true, false} {
		pipe := c.Pipeline()
		cmd := ClaimManyCmd(ctx, pipe, &k, 0, false, Form{PackedOutbox: packed}, []ClaimArg{{User: fmt.Sprintf("u:%d", i), Serial: int64(i + 1)}}, nil)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if got, errs, err := ParseClaimMany(cmd, 1); err != nil || errs[0] != nil || got[0].Outcome != Granted {
			t.Fatalf("claim (packed %v) = %+v, %v, %v; want granted", packed, got, errs, err)
		}
	}
	entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
	if err != nil || len(entries) != 2 {
		t.Fatalf("outbox = %v, %v; want two entries", entries, err)
	}
	if v := entries[0].Values; len(v) != 1 || v["g"] == nil {
		t.Fatalf("packed entry = %v, want one field g", v)
	}
	v := entries[1].Values
	if v["type"] != "grant" || v["pool"] != "r" || v["sub"] != "1" || v["user"] != "u:1" || v["serial"] != "2" ||
		v["amount"] == nil || v["deadline_ms"] == nil {
		t.Fatalf("entry in fields = %v, want type grant, pool r, sub 1, user u:1, serial 2, amount, deadline_ms", v)
	}
	for i, en := range entries {
		e, err := ParseOutboxEntry(en.Values)
		if err != nil || e.Release || e.User != fmt.Sprintf("u:%d", i) || e.Serial != int64(i+1) || e.Amount == 0 {
			t.Fatalf("entry %v = %+v, %v", en.Values, e, err)
		}
	}
}

// TestCountersPastDoublesStayExact: a tally past 2^53 cents (a season of
// turnovers of a pool at rain's cap) moves exactly, where a sum in a Lua
// number would round: write_books leaves such a counter to HINCRBY.
func TestCountersPastDoublesStayExact(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 0, 20, 7, 8) // a hold of 20 ms
	const big = "9007199254740993"      // 2^53 + 1: no double holds it
	if err := c.HSet(ctx, k.Meta, "released_cents", big).Err(); err != nil {
		t.Fatal(err)
	}
	first, err := claimOne(ctx, c, &k, "u", 1, "", 0)
	if err != nil || first.Outcome != Granted {
		t.Fatalf("claim = %+v, %v; want granted", first, err)
	}
	waittest.Until(t, 5*time.Second, "the grant's deadline passed on the shard's clock", func() bool {
		tm, err := c.Time(ctx).Result()
		return err == nil && tm.UnixMilli() > first.DeadlineMS
	})
	if next, err := claimOne(ctx, c, &k, "u", 2, "", 0); err != nil || next.Outcome != Granted {
		t.Fatalf("a grab after the hold ran out = %+v, %v; want granted", next, err)
	}
	want := strconv.FormatInt(9007199254740993+first.Amount, 10)
	if got, _ := c.HGet(ctx, k.Meta, "released_cents").Result(); got != want {
		t.Fatalf("released_cents = %s, want %s exactly", got, want)
	}
}
