package ledger

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unicode/utf8"

	"rain/internal/settle"
)

// FuzzReadLines: a ledger file of any bytes (one a crash tore, a file
// someone edited) is read without a panic; what is taken is whole lines
// only, the bytes counted end at a newline, and no serial is 0 or less, or twice.
func FuzzReadLines(f *testing.F) {
	for _, s := range []string{
		"",
		`{"serial":1,"pool_id":"p","sub_pool":0,"user_id":"u","amount_cents":100,"deadline_ms":0,"granted_at":"2026-01-01T00:00:00Z","settled_at":"2026-01-01T00:00:01Z"}` + "\n",
		`{"serial":1}` + "\n" + `{"serial":1}` + "\n",
		`{"serial":2}` + "\n" + `{"seri`,
		"not json\n",
		`{"serial":0}` + "\n",
		`{"serial":"3"}` + "\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		grants, good, err := readLines(bytes.NewReader(b))
		if err != nil {
			return
		}
		if good < 0 || good > int64(len(b)) || (good > 0 && b[good-1] != '\n') {
			t.Fatalf("readLines counted %d good bytes of %q", good, b)
		}
		if bytes.IndexByte(b[good:], '\n') >= 0 {
			t.Fatalf("readLines left a whole line after byte %d of %q", good, b)
		}
		if lines := bytes.Count(b[:good], []byte("\n")); lines != len(grants) {
			t.Fatalf("readLines took %d grants from %d lines of %q", len(grants), lines, b)
		}
		for serial, g := range grants {
			if serial <= 0 || g.Serial != serial {
				t.Fatalf("readLines took serial %d as %+v", serial, g)
			}
		}
	})
}

// FuzzLedgerRoundTrip: a grant of any ids and amounts delivered to a
// ledger, paid or settled unpaid, reads back as it was given, after the
// ledger is opened again (the files' lines are what a restarted worker and
// an audit read), from the file of its kind; delivered again, it is a
// repeat, not a conflict nor a second line. A serial that is not positive
// is refused, and nothing written.
func FuzzLedgerRoundTrip(f *testing.F) {
	f.Add(int64(1), "p", 0, "u", int64(100), int64(1_700_000_000_000), false)
	f.Add(int64(-7), "p\"\\\n", 3, "用户\u2028", int64(-1), int64(0), false)
	f.Add(int64(1<<62), "", -1, "\xff\xfe", int64(1<<62), int64(-1), true)
	f.Add(int64(9), "p", 1, "u", int64(5), int64(0), true)
	f.Fuzz(func(t *testing.T, serial int64, pool string, sub int, user string, amount, deadline int64, released bool) {
		if !utf8.ValidString(pool) || !utf8.ValidString(user) {
			// rain's ids are ASCII (settlement takes no other:
			// rain.ValidID); JSON strings hold only UTF-8.
			return
		}
		g := settle.Grant{Serial: serial, PoolID: pool, SubPool: sub, UserID: user, AmountCents: amount, DeadlineMS: deadline,
			GrantedAt: time.UnixMilli(1_700_000_000_123).UTC()}
		mine, other := "", UnpaidSuffix
		if released {
			g.Unpaid = settle.Released
			mine, other = other, mine
		}
		path := filepath.Join(t.TempDir(), "ledger.jsonl")
		l, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		err = deliverOne(context.Background(), l, g)
		_ = l.Close()
		if serial <= 0 {
			b, _ := os.ReadFile(path + mine)
			if err == nil || len(b) != 0 {
				t.Fatalf("Deliver(%+v) = %v, and the file holds %q; want it refused, nothing written", g, err, b)
			}
			return
		}
		if err != nil {
			t.Fatalf("Deliver(%+v) = %v", g, err)
		}
		l, err = Open(path)
		if err != nil {
			t.Fatalf("Open after a delivery of %+v: %v", g, err)
		}
		defer l.Close()
		if err := deliverOne(context.Background(), l, g); err != nil {
			t.Fatalf("a repeat of %+v = %v, want nil", g, err)
		}
		f, err := os.Open(path + mine)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		grants, _, err := readLines(f)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := grants[serial]
		if len(grants) != 1 || !ok || !got.Same(g) || got.Unpaid != g.Unpaid || got.DeadlineMS != deadline || !got.GrantedAt.Equal(g.GrantedAt) {
			t.Fatalf("ledger reads back %+v, want %+v", grants, g)
		}
		if b, _ := os.ReadFile(path + mine); bytes.Count(b, []byte("\n")) != 1 {
			t.Fatalf("the file holds %q, want one line", b)
		}
		if b, _ := os.ReadFile(path + other); len(b) != 0 {
			t.Fatalf("the other file holds %q, want nothing", b)
		}
		if paid, err := Read(path); err != nil || len(paid) != map[bool]int{false: 1, true: 0}[released] {
			t.Fatalf("Read = %v, %v; want the grant only when paid", paid, err)
		}
	})
}
