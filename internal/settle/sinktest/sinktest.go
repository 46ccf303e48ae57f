// Package sinktest checks a settle.Sink that records the grants settled
// unpaid (settle.RecordsUnpaid) against that contract: each serial settled
// one way, across calls and across callers at once.
package sinktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"rain/internal/settle"
)

// Grant is a grant of pool "p" under serial, for user, of cents; unpaid
// as settle.Grant.Unpaid.
func Grant(serial int64, user string, cents int64, unpaid string) settle.Grant {
	return settle.Grant{Serial: serial, PoolID: "p", SubPool: int(serial % 2), UserID: user, AmountCents: cents,
		GrantedAt: time.UnixMilli(1_800_000_000_000 + serial).UTC(), Unpaid: unpaid}
}

// Expect delivers gs to s in one call and fails t unless each answer is
// want's (nil: nil; an error: one that errors.Is it).
func Expect(t *testing.T, s settle.Sink, gs []settle.Grant, want ...error) {
	t.Helper()
	errs := s.Deliver(context.Background(), gs)
	for i, w := range want {
		if (w == nil && errs[i] != nil) || (w != nil && !errors.Is(errs[i], w)) {
			t.Fatalf("Deliver of %+v: %v, want %v", gs[i], errs[i], w)
		}
	}
}

// OneWayEach checks the contract on s, from one caller: a grant settled
// unpaid, given again, is a repeat, and given to pay ErrSettledUnpaid; a
// grant paid, given unpaid, ErrPaid; another grant under a serial held
// either way, given either way, ErrSerialConflict; and within one call, a serial given both
// ways is settled the first way, the second ErrSerialConflict.
func OneWayEach(t *testing.T, s settle.RecordsUnpaid) {
	t.Helper()
	if !s.RecordsUnpaid() {
		t.Fatal("RecordsUnpaid() = false")
	}
	Expect(t, s, []settle.Grant{Grant(1, "a", 10, settle.Released), Grant(2, "b", 20, ""), Grant(3, "c", 30, settle.Unmatched)},
		nil, nil, nil)
	Expect(t, s, []settle.Grant{Grant(1, "a", 10, settle.Released), Grant(3, "c", 30, settle.Unmatched), Grant(2, "b", 20, "")},
		nil, nil, nil)
	Expect(t, s, []settle.Grant{Grant(1, "a", 10, ""), Grant(3, "c", 30, ""), Grant(2, "b", 20, settle.Released), Grant(2, "b", 20, settle.Unmatched)},
		settle.ErrSettledUnpaid, settle.ErrSettledUnpaid, settle.ErrPaid, settle.ErrPaid)
	Expect(t, s, []settle.Grant{Grant(1, "mallory", 10, settle.Released), Grant(2, "mallory", 20, "")},
		settle.ErrSerialConflict, settle.ErrSerialConflict)
	Expect(t, s, []settle.Grant{Grant(1, "mallory", 10, ""), Grant(2, "mallory", 20, settle.Released)},
		settle.ErrSerialConflict, settle.ErrSerialConflict)
	Expect(t, s, []settle.Grant{Grant(4, "d", 40, settle.Released), Grant(4, "d", 40, ""), Grant(5, "e", 50, ""), Grant(5, "e", 50, settle.Released)},
		nil, settle.ErrSerialConflict, nil, settle.ErrSerialConflict)
	// What stays is what was settled first.
	Expect(t, s, []settle.Grant{Grant(1, "a", 10, settle.Released), Grant(2, "b", 20, ""), Grant(4, "d", 40, settle.Released), Grant(5, "e", 50, "")},
		nil, nil, nil, nil)
}

// Race delivers n serials from from on, each to pay from one caller and
// unpaid from another at once, and checks that each serial was settled one
// way: one of the two answered nil, the other ErrPaid or ErrSettledUnpaid,
// and the serial answers so ever after.
func Race(t *testing.T, s settle.RecordsUnpaid, from int64, n int) {
	t.Helper()
	paid, unpaid := make([]error, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		serial := from + int64(i)
		g := Grant(serial, fmt.Sprint("u", serial), 1+serial%100, "")
		u := Grant(serial, fmt.Sprint("u", serial), 1+serial%100, settle.Released)
		wg.Go(func() { paid[i] = s.Deliver(context.Background(), []settle.Grant{g})[0] })
		wg.Go(func() { unpaid[i] = s.Deliver(context.Background(), []settle.Grant{u})[0] })
	}
	wg.Wait()
	won := 0
	for i := range n {
		serial := from + int64(i)
		g := Grant(serial, fmt.Sprint("u", serial), 1+serial%100, "")
		u := g
		u.Unpaid = settle.Released
		switch {
		case paid[i] == nil && errors.Is(unpaid[i], settle.ErrPaid):
			won++
			Expect(t, s, []settle.Grant{g, u}, nil, settle.ErrSerialConflict)
			Expect(t, s, []settle.Grant{u}, settle.ErrPaid)
		case unpaid[i] == nil && errors.Is(paid[i], settle.ErrSettledUnpaid):
			Expect(t, s, []settle.Grant{u}, nil)
			Expect(t, s, []settle.Grant{g}, settle.ErrSettledUnpaid)
		default:
			t.Fatalf("serial %d given to pay and unpaid at once: paid %v, unpaid %v; want one nil and the other refused", serial, paid[i], unpaid[i])
		}
	}
	t.Logf("%d serials of %d paid, the others settled unpaid", won, n)
}
