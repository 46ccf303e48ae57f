package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"rain/internal/settle"
	"rain/internal/settle/sinktest"
)

// openLedger opens the ledger at path, closed when the test ends (a test
// may close it earlier, as a crash would, and open it again).
func openLedger(t *testing.T, path string) *File {
	t.Helper()
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// readLedger reads the ledger's grants by serial (one line per serial).
func readLedger(t *testing.T, path string) map[int64]settle.Grant {
	t.Helper()
	grants, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return grants
}

// deliverOne delivers one grant to l.
func deliverOne(ctx context.Context, l *File, g settle.Grant) error {
	return l.Deliver(ctx, []settle.Grant{g})[0]
}

func TestLedgerTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	ctx := context.Background()
	for _, s := range []int64{1, 2, 2, 3} {
		if err := deliverOne(ctx, l, settle.Grant{Serial: s, PoolID: "p", UserID: "u", AmountCents: 5}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	// A crash mid-write leaves half a line.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(`{"serial":4,"pool_`)
	f.Close()
	l, err := Open(path)
	if err != nil {
		t.Fatalf("OpenLedger after a torn write: %v", err)
	}
	for _, s := range []int64{3, 4} {
		if err := deliverOne(ctx, l, settle.Grant{Serial: s, PoolID: "p", UserID: "u", AmountCents: 5}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	if got := readLedger(t, path); len(got) != 4 {
		t.Fatalf("ledger serials = %v, want 1-4 once each", got)
	}
	os.WriteFile(path, []byte("not json\n"), 0o644)
	if _, err := Open(path); err == nil {
		t.Fatal("OpenLedger of a corrupt ledger succeeded, want an error")
	}
}

// TestLedgerFailedFsync: a delivery whose fsync fails is cut off the file
// (the disk may hold it or not), so it is written once when delivered
// again, and the ledger still opens: a failed fsync never leaves a serial
// on two lines. A ledger file is its owner's alone.
func TestLedgerFailedFsync(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	g := func(s int64) settle.Grant { return settle.Grant{Serial: s, PoolID: "p", UserID: "u", AmountCents: 5} }
	if err := deliverOne(ctx, l, g(1)); err != nil {
		t.Fatal(err)
	}
	fail := true
	l.sync = func(f *os.File) error {
		if fail {
			fail = false
			return errors.New("input/output error") // as a disk that refused the fsync
		}
		return f.Sync()
	}
	if errs := l.Deliver(ctx, []settle.Grant{g(2), g(3)}); errs[0] == nil || errs[1] == nil {
		t.Fatalf("Deliver with a failed fsync = %v; want both failed (delivered again later)", errs)
	}
	if errs := l.Deliver(ctx, []settle.Grant{g(2), g(3)}); errs[0] != nil || errs[1] != nil {
		t.Fatalf("Deliver again = %v", errs)
	}
	l.Close()
	if got := readLedger(t, path); len(got) != 3 {
		t.Fatalf("ledger serials = %v, want 1-3 once each", got)
	}
	if _, err := Open(path); err != nil {
		t.Fatalf("OpenLedger after a failed fsync: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ledger mode %v, %v; want 0600 (it names every user paid)", fi.Mode().Perm(), err)
	}
}

// TestUnpaidOneWayEach: the ledger records the grants settled unpaid and
// answers for each serial the one way it was settled
// (settle.RecordsUnpaid), opened again too; Read gives the grants it paid.
func TestUnpaidOneWayEach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	sinktest.OneWayEach(t, l)
	sinktest.Race(t, l, 1000, 50)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	again := openLedger(t, path)
	sinktest.Expect(t, again, []settle.Grant{sinktest.Grant(1, "a", 10, ""), sinktest.Grant(2, "b", 20, settle.Released)},
		settle.ErrSettledUnpaid, settle.ErrPaid)
	b, err := os.ReadFile(path)
	if err != nil || bytes.Contains(b, []byte("unpaid")) {
		t.Fatalf("the ledger of what was paid holds %q (%v); want no grant settled unpaid", b, err)
	}
	paid := readLedger(t, path)
	// Settled unpaid: serials 1, 3 and 4, and those of the race not paid
	// (all paid but 2 and 5 are the race's).
	u, err := os.ReadFile(path + UnpaidSuffix)
	if n, want := bytes.Count(u, []byte("\n")), 3+50-(len(paid)-2); err != nil || n != want {
		t.Fatalf("the file of the grants settled unpaid holds %d lines (%v), want %d", n, err, want)
	}
	for _, s := range []int64{1, 3, 4} {
		if _, ok := paid[s]; ok {
			t.Fatalf("Read gives serial %d, settled unpaid", s)
		}
	}
	for _, s := range []int64{2, 5} {
		if g, ok := paid[s]; !ok || g.Unpaid != "" {
			t.Fatalf("Read gives serial %d as %+v, %v; want it paid", s, g, ok)
		}
	}
}

// TestUnpaidFileFails: a delivery of both kinds whose write of the grants
// settled unpaid fails (their fsync refused) keeps the grants it paid and
// answers the others a failure: delivered again, they are written once;
// a repeat of a failed grant in the same call fails with it. The unpaid
// file's torn tail is cut off at open, as the ledger's is.
func TestUnpaidFileFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	l.sync = func(f *os.File) error {
		if f == l.u {
			return errors.New("input/output error")
		}
		return f.Sync()
	}
	paid, unpaid := sinktest.Grant(1, "a", 10, ""), sinktest.Grant(2, "b", 20, settle.Released)
	errs := l.Deliver(context.Background(), []settle.Grant{paid, unpaid, unpaid})
	if errs[0] != nil || errs[1] == nil || errs[2] == nil {
		t.Fatalf("Deliver with the unpaid file's fsync refused = %v; want the paid grant delivered, the unpaid one and its repeat failed", errs)
	}
	l.sync = (*os.File).Sync
	sinktest.Expect(t, l, []settle.Grant{paid, unpaid}, nil, nil)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// A torn tail in the unpaid file: cut off, the grant delivered again.
	f, err := os.OpenFile(path+UnpaidSuffix, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"serial":3,"pool_id":"p","unp`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	again := openLedger(t, path)
	sinktest.Expect(t, again, []settle.Grant{paid, unpaid, sinktest.Grant(3, "c", 30, settle.Released)}, nil, nil, nil)
	again.Close()
	u, err := os.ReadFile(path + UnpaidSuffix)
	if n := bytes.Count(u, []byte("\n")); err != nil || n != 2 || bytes.Contains(u, []byte(`"unp"`)) {
		t.Fatalf("the unpaid file holds %q (%v); want serials 2 and 3, a line each", u, err)
	}
}

// TestLedgerFilesThatDisagree: a ledger whose two files hold one serial,
// or a line of the wrong kind (a grant settled unpaid in the ledger of
// what was paid, or the other way), does not open.
func TestLedgerFilesThatDisagree(t *testing.T) {
	line := func(g settle.Grant) string {
		b, err := json.Marshal(ledgerLine{Grant: g})
		if err != nil {
			t.Fatal(err)
		}
		return string(b) + "\n"
	}
	for _, c := range []struct {
		name, paid, unpaid, want string
	}{
		{"both", line(sinktest.Grant(1, "a", 10, "")), line(sinktest.Grant(1, "a", 10, settle.Released)), "both paid and settled unpaid"},
		{"unpaid in the ledger", line(sinktest.Grant(1, "a", 10, settle.Released)), "", `is settled "released"`},
		{"paid in the unpaid file", "", line(sinktest.Grant(1, "a", 10, "")), `is settled ""`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.jsonl")
			if err := os.WriteFile(path, []byte(c.paid), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path+UnpaidSuffix, []byte(c.unpaid), 0o600); err != nil {
				t.Fatal(err)
			}
			if l, err := Open(path); err == nil || !strings.Contains(err.Error(), c.want) {
				if err == nil {
					l.Close()
				}
				t.Fatalf("Open = %v, want an error saying %q", err, c.want)
			}
		})
	}
}

// TestLedgerWithoutItsUnpaidFile: a ledger that holds grants and has no
// file of those settled unpaid beside it (restored without it) does not
// open, saying what to do; created empty, it opens. Nor does a ledger gone
// from beside a file of grants settled unpaid.
func TestLedgerWithoutItsUnpaidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.jsonl")
	l := openLedger(t, path)
	sinktest.Expect(t, l, []settle.Grant{sinktest.Grant(1, "a", 10, "")}, nil)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path + UnpaidSuffix); err != nil {
		t.Fatal(err)
	}
	if again, err := Open(path); err == nil || !strings.Contains(err.Error(), "touch "+path+UnpaidSuffix) {
		if err == nil {
			again.Close()
		}
		t.Fatalf("Open of a ledger without its unpaid file = %v, want a refusal naming it", err)
	}
	if err := os.WriteFile(path+UnpaidSuffix, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sinktest.Expect(t, openLedger(t, path), []settle.Grant{sinktest.Grant(1, "a", 10, "")}, nil)
	// The other way: the ledger gone beside grants settled unpaid.
	other := filepath.Join(t.TempDir(), "ledger.jsonl")
	u := openLedger(t, other)
	sinktest.Expect(t, u, []settle.Grant{sinktest.Grant(2, "b", 20, settle.Released)}, nil)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(other); err != nil {
		t.Fatal(err)
	}
	if again, err := Open(other); err == nil || !strings.Contains(err.Error(), "is missing") {
		if err == nil {
			again.Close()
		}
		t.Fatalf("Open of a ledger gone beside its unpaid file = %v, want a refusal", err)
	}
}
