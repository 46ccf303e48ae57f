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

// TestParseOutboxEntries reads an entry of a batch's grants whole, each
// grant as the packed form reads it, and refuses the whole entry when one
// of its grants is unreadable (settlement then leaves it for an operator,
// never pays part of it and acknowledges the rest); every other form reads
// as ParseOutboxEntry reads it, one entry.
func TestParseOutboxEntries(t *testing.T) {
	got, err := ParseOutboxEntries(map[string]any{"G": "250:17:1790000000000:u:1 5:18:1790000000000:u2"})
	want := []OutboxEntry{{User: "u:1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000},
		{User: "u2", Amount: 5, Serial: 18, DeadlineMS: 1790000000000}}
	if err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ParseOutboxEntries = %+v, %v; want %+v", got, err, want)
	}
	for _, g := range []string{"", " ", "250:17:1790000000000:u1 ", "250:17:1790000000000:u1  5:18:1:u2",
		"250:17:1790000000000:u1 x:18:1:u2", "250:17:1790000000000:u1 5:18:1"} {
		if got, err := ParseOutboxEntries(map[string]any{"G": g}); err == nil || len(got) != 1 || got[0].Release {
			t.Errorf("ParseOutboxEntries(G %q) = %+v, %v; want an error, and not a release", g, got, err)
		}
	}
	for _, v := range []map[string]any{{"g": "250:17:1790000000000:u:1"}, {"r": "250:17:1790000000000:u1"}, {"r": "damaged"}, {"type": "x"}} {
		one, err1 := ParseOutboxEntry(v)
		got, err := ParseOutboxEntries(v)
		if len(got) != 1 || got[0] != one || (err == nil) != (err1 == nil) {
			t.Errorf("ParseOutboxEntries(%v) = %+v, %v; ParseOutboxEntry = %+v, %v", v, got, err, one, err1)
		}
	}
}

// FuzzParseOutboxEntries: any entry of a batch's grants is read or
// refused, never a panic; one read has a grant per space-separated part,
// each read as the packed form reads it alone.
func FuzzParseOutboxEntries(f *testing.F) {
	f.Add("250:17:1790000000000:u1 5:18:1790000000000:u:2")
	f.Add(" ")
	f.Fuzz(func(t *testing.T, group string) {
		es, err := ParseOutboxEntries(map[string]any{"G": group})
		if err != nil {
			return
		}
		parts := strings.Split(group, " ")
		if len(es) != len(parts) {
			t.Fatalf("ParseOutboxEntries(%q) = %d grants, %d parts", group, len(es), len(parts))
		}
		for i, part := range parts {
			if e, err := ParseOutboxEntry(map[string]any{"g": part}); err != nil || e != es[i] {
				t.Fatalf("ParseOutboxEntries(%q)[%d] = %+v; alone %+v, %v", group, i, es[i], e, err)
			}
		}
	})
}

// TestClaimWritesTheOutboxFormAsked: claim_many writes a grant's entry
// packed when asked, a field per value by default (what a rain settle
// older than the packed form pays: type grant, pool, sub, user, amount,
// serial, deadline_ms), and under batch one entry G for the grants of the
// batch, each read back by ParseOutboxEntries as it was made.
func TestClaimWritesTheOutboxFormAsked(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := openSubPool(t, c, 1, 5000, 10, 20, 30, 40, 50)
	forms := []OutboxForm{OutboxPacked, OutboxFields, OutboxBatch}
	batch := []ClaimArg{{User: "u:2", Serial: 3}, {User: "u:3", Serial: 4}, {User: "u:2", Serial: 5}, {User: "u:4", Serial: 6}}
	var made []Claim // the grants made, in order
	for i, form := range forms {
		claims := []ClaimArg{{User: fmt.Sprintf("u:%d", i), Serial: int64(i + 1)}}
		if form == OutboxBatch {
			claims = batch
		}
		pipe := c.Pipeline()
		cmd := ClaimManyCmd(ctx, pipe, &k, 0, false, Form{Outbox: form}, claims, nil)
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		got, errs, err := ParseClaimMany(cmd, len(claims))
		if err != nil {
			t.Fatal(err)
		}
		for j, g := range got {
			if errs[j] != nil {
				t.Fatalf("claim %d (%v) = %v", j, form, errs[j])
			}
			if g.Outcome == Granted {
				made = append(made, g)
			}
		}
	}
	if len(made) != 5 { // u:2's second claim finds its grant
		t.Fatalf("made %d grants, want 5: %+v", len(made), made)
	}
	entries, err := c.XRange(ctx, k.Outbox, "-", "+").Result()
	if err != nil || len(entries) != 3 {
		t.Fatalf("outbox = %v, %v; want three entries", entries, err)
	}
	if v := entries[0].Values; len(v) != 1 || v["g"] == nil {
		t.Fatalf("packed entry = %v, want one field g", v)
	}
	v := entries[1].Values
	if v["type"] != "grant" || v["pool"] != "r" || v["sub"] != "1" || v["user"] != "u:1" || v["serial"] != "2" ||
		v["amount"] == nil || v["deadline_ms"] == nil {
		t.Fatalf("entry in fields = %v, want type grant, pool r, sub 1, user u:1, serial 2, amount, deadline_ms", v)
	}
	if v := entries[2].Values; len(v) != 1 || v["G"] == nil {
		t.Fatalf("batch entry = %v, want one field G", v)
	}
	if _, err := ParseOutboxEntry(entries[2].Values); err == nil {
		t.Fatal("ParseOutboxEntry read an entry of several grants as one")
	}
	var read []OutboxEntry
	for _, en := range entries {
		es, err := ParseOutboxEntries(en.Values)
		if err != nil {
			t.Fatalf("entry %v: %v", en.Values, err)
		}
		read = append(read, es...)
	}
	users := []string{"u:0", "u:1", "u:2", "u:3", "u:4"}
	if len(read) != len(made) {
		t.Fatalf("read %d grants, made %d", len(read), len(made))
	}
	for i, e := range read {
		if e.Release || e.User != users[i] || e.Serial != made[i].Serial || e.Amount != made[i].Amount || e.DeadlineMS != made[i].DeadlineMS {
			t.Errorf("grant %d read %+v; made %+v for %s", i, e, made[i], users[i])
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
