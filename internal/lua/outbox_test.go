package lua

import (
	"testing"
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
		{"adopted grant", map[string]any{"g": "250:17:1790000000000:u1", "o": "3"},
			OutboxEntry{User: "u1", Amount: 250, Serial: 17, DeadlineMS: 1790000000000, Origin: "3"}},
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
		{"type": "grant", "pool": "p", "sub": "x", "user": "u1", "amount": "1", "serial": "1", "deadline_ms": "1"},
		{"type": "grant", "pool": "p", "sub": "0", "user": "u1", "amount": "1", "serial": "1"},
		{"type": "other"},
	} {
		if got, err := ParseOutboxEntry(v); err == nil {
			t.Errorf("ParseOutboxEntry(%v) = %+v, nil; want an error", v, got)
		}
	}
}

// FuzzParseOutboxEntry: any packed value is read or refused, never a
// panic, and one read is a grant with a user and the origin given.
func FuzzParseOutboxEntry(f *testing.F) {
	f.Add("250:17:1790000000000:u1", "")
	f.Add("1:2:3:a:b:c", "0")
	f.Add(":::", "")
	f.Fuzz(func(t *testing.T, packed, origin string) {
		e, err := ParseOutboxEntry(map[string]any{"g": packed, "o": origin})
		if err != nil {
			return
		}
		if e.Release || e.User == "" || e.Origin != origin {
			t.Fatalf("ParseOutboxEntry(%q) = %+v", packed, e)
		}
	})
}
