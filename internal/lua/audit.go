package lua

// This file is the audit's reads of a sub-pool: its counters at once, then
// its records in bounded pages.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"rain"
)

// SubPoolAudit is one sub-pool read for the audit: the meta counters beside
// recounts of the stock list, the grants and the spill records. Field names
// are the script's reply names.
type SubPoolAudit struct {
	Found                          bool
	State                          string
	Version                        int64 // bumped by every money move
	Count, Cents                   int64 // what it was preloaded with
	StockCount, StockCents         int64 // meta counters
	HeldCount, HeldCents           int64
	ConfirmedCount, ConfirmedCents int64
	ReleasedCount, ReleasedCents   int64
	ReceivedCount, ReceivedCents   int64 // granted here, taken from siblings
	SentCount, SentCents           int64 // taken from here, acked by their homes
	InflightCount, InflightCents   int64 // taken from here, not resolved yet
	ListLen                        int64 // LLEN of the stock, read with the counters
	DeadlineEntries                int64 // users the deadline index names, read with the counters (at least HeldCount)
	Transfers, TransfersCents      int64 // recount of transfers in flight, read with the counters
	BadRecords                     int64 // grant and spill records that do not parse

	// The recounts below are read in pages after the counters; Recounted
	// says the sub-pool did not change meanwhile (its version held), so
	// they may be compared with the counters. On a pool in the middle of a
	// rain they may not be: the counter checks above hold regardless.
	Recounted                             bool
	ListSum                               int64 // recount of the stock list
	GrantsHeld, GrantsHeldCents           int64 // recount of the grants by state
	GrantsConfirmed, GrantsConfirmedCents int64
	GrantsReleased, GrantsReleasedCents   int64
	DuplicateSerials                      int64
	// Unindexed counts the held grants that no member of the deadline
	// index names under their deadline: grants the reaper would never
	// release.
	Unindexed             int64
	Acked, AckedCents     int64 // recount of resolved transfers
	Untaken, UntakenCents int64
	Adopted, AdoptedCents int64 // recount of adopted verdicts

	// The spill records, for matching across sub-pools (token -> record).
	TransferRecords, ResolvedRecords, VerdictRecords map[string]string
}

func (a *SubPoolAudit) numbers() map[string]*int64 {
	return map[string]*int64{
		"count": &a.Count, "cents": &a.Cents, "stock_count": &a.StockCount, "stock_cents": &a.StockCents,
		"held_count": &a.HeldCount, "held_cents": &a.HeldCents,
		"confirmed_count": &a.ConfirmedCount, "confirmed_cents": &a.ConfirmedCents,
		"released_count": &a.ReleasedCount, "released_cents": &a.ReleasedCents,
		"received_count": &a.ReceivedCount, "received_cents": &a.ReceivedCents,
		"sent_count": &a.SentCount, "sent_cents": &a.SentCents,
		"inflight_count": &a.InflightCount, "inflight_cents": &a.InflightCents,
		"version": &a.Version, "list_len": &a.ListLen, "deadline_entries": &a.DeadlineEntries,
		"transfers": &a.Transfers, "transfers_cents": &a.TransfersCents, "bad_records": &a.BadRecords,
	}
}

// Audit paging: how much one command of the recount reads. An LRANGE of
// 5,000 amounts or an HSCAN of about 500 grants takes a shard about 1 ms
// (2.5 ms on a loaded machine), so an audit of any size never holds a rain
// up for 5 ms.
const (
	AuditListPage = 5_000 // amounts one LRANGE of a stock reads
	AuditHashPage = 500   // the COUNT of one HSCAN of a grants or spill hash
	// AuditIndexPage is the COUNT of one ZSCAN of a deadline index's
	// batches, whose members each name up to a batch of users (the
	// deadlines, a user each, are read AuditHashPage at a time).
	AuditIndexPage = 20
	auditTries     = 3 // recounts tried before a changing sub-pool is left unrecounted
)

// AuditSubPool reads the sub-pool for the audit: its counters atomically
// (one script, constant time), then the recounts in bounded pages; when the
// sub-pool's version moved meanwhile it reads both again, at most
// auditTries times, and then returns with Recounted false: the counters
// hold, the recount sums are not to be compared with them, and the spill
// records read are still good for matching (they only move forward).
func AuditSubPool(ctx context.Context, c redis.Cmdable, sp rain.SubPool) (SubPoolAudit, error) {
	k := sp.Keys()
	for try := 1; ; try++ {
		a, err := auditCounters(ctx, c, sp, &k)
		if err != nil || !a.Found {
			return a, err
		}
		r := a
		if err := recount(ctx, c, &k, &r); err != nil {
			return a, fmt.Errorf("audit %s: %w", sp.Tag(), err)
		}
		v, err := c.HGet(ctx, k.Meta, "version").Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return a, fmt.Errorf("audit %s: %w", sp.Tag(), err)
		}
		if v == a.Version {
			r.Recounted = true
			return r, nil
		}
		if try == auditTries {
			return r, nil // its records serve the spill matching; its sums are not trusted
		}
	}
}

// auditCounters runs the audit script: the counters and what goes with them.
func auditCounters(ctx context.Context, c redis.Cmdable, sp rain.SubPool, k *rain.Keys) (SubPoolAudit, error) {
	res, err := auditScript.Run(ctx, c, []string{k.Meta, k.Stock, k.Deadlines, k.Transfers, k.Batches}).Slice()
	if err != nil {
		return SubPoolAudit{}, fmt.Errorf("audit %s: %w", sp.Tag(), err)
	}
	var a SubPoolAudit
	nums := a.numbers()
	for i := 0; i+1 < len(res); i += 2 {
		name := str(res, i)
		switch v := res[i+1].(type) {
		case int64:
			if name == "found" {
				a.Found = v == 1
			} else if p := nums[name]; p != nil {
				*p = v
			} else {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
		case string:
			if name != "state" {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
			a.State = v
		case []any:
			if name != "transfers_list" {
				return a, fmt.Errorf("audit %s: unexpected field %q", sp.Tag(), name)
			}
			a.TransferRecords = pairs(v)
		}
	}
	return a, nil
}

// recount reads the stock list and the grants, resolved and verdicts hashes
// page by page into a's recount fields.
func recount(ctx context.Context, c redis.Cmdable, k *rain.Keys, a *SubPoolAudit) error {
	for off := int64(0); ; off += AuditListPage {
		items, err := c.LRange(ctx, k.Stock, off, off+AuditListPage-1).Result()
		if err != nil {
			return err
		}
		for _, it := range items {
			n, err := strconv.ParseInt(it, 10, 64)
			if err != nil {
				a.BadRecords++
				continue
			}
			a.ListSum += n
		}
		if len(items) < AuditListPage {
			break
		}
	}
	serials := map[string]bool{}
	held := map[string]int64{} // user -> deadline of the grant held
	err := scanHash(ctx, c, k.Grants, func(user, rec string) {
		st, amount, serial, ok := grantFields(rec)
		switch {
		case !ok:
			a.BadRecords++
			return
		case st == 'h':
			a.GrantsHeld, a.GrantsHeldCents = a.GrantsHeld+1, a.GrantsHeldCents+amount
			held[user], _ = strconv.ParseInt(rec[strings.LastIndexByte(rec, ':')+1:], 10, 64) // grantFields read it
		case st == 'c':
			a.GrantsConfirmed, a.GrantsConfirmedCents = a.GrantsConfirmed+1, a.GrantsConfirmedCents+amount
		case st == 'r':
			a.GrantsReleased, a.GrantsReleasedCents = a.GrantsReleased+1, a.GrantsReleasedCents+amount
		default:
			a.BadRecords++
			return
		}
		if serials[serial] {
			a.DuplicateSerials++
		}
		serials[serial] = true
	})
	if err != nil {
		return err
	}
	for _, index := range []struct {
		key  string
		page int64
	}{{k.Deadlines, AuditHashPage}, {k.Batches, AuditIndexPage}} {
		if err := unindexed(ctx, c, index.key, index.page, held); err != nil {
			return err
		}
	}
	a.Unindexed = int64(len(held))
	a.ResolvedRecords = map[string]string{}
	if err := scanHash(ctx, c, k.Resolved, func(token, rec string) {
		a.ResolvedRecords[token] = rec
		t, err := ParseTransfer(rec, true)
		switch {
		case err != nil:
			a.BadRecords++
		case t.State == 'a':
			a.Acked, a.AckedCents = a.Acked+1, a.AckedCents+t.Amount
		default:
			a.Untaken, a.UntakenCents = a.Untaken+1, a.UntakenCents+t.Amount
		}
	}); err != nil {
		return err
	}
	a.VerdictRecords = map[string]string{}
	return scanHash(ctx, c, k.Verdicts, func(token, rec string) {
		a.VerdictRecords[token] = rec
		v, err := ParseVerdict(rec)
		switch {
		case err != nil:
			a.BadRecords++
		case v.Adopted:
			a.Adopted, a.AdoptedCents = a.Adopted+1, a.AdoptedCents+v.Amount
		}
	})
}

// unindexed reads a deadline index key with ZSCAN in pages and deletes from
// held (user -> deadline) every grant a member names under its deadline:
// what is left is held and unnamed. A member that is there from the first
// page to the last is read at least once. One that comes or goes meanwhile
// is a money move, which the recount's version check sees, or the reaper
// dropping a member that names no grant still held.
func unindexed(ctx context.Context, c redis.Cmdable, key string, page int64, held map[string]int64) error {
	var cursor uint64
	for len(held) > 0 {
		ms, next, err := c.ZScan(ctx, key, cursor, "", page).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(ms); i += 2 {
			score, err := strconv.ParseFloat(ms[i+1], 64)
			if err != nil {
				continue // not a deadline: it names nothing
			}
			for _, user := range strings.Split(ms[i], " ") { // as the reaper reads a member (prelude.lua)
				if d, ok := held[user]; ok && float64(d) == score {
					delete(held, user)
				}
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	return nil
}

// scanHash calls f once per field of the hash at key, reading it with HSCAN
// in pages of about AuditHashPage (a field HSCAN returns twice, as it may
// while the hash grows, is seen once).
func scanHash(ctx context.Context, c redis.Cmdable, key string, f func(field, value string)) error {
	seen := map[string]bool{}
	var cursor uint64
	for {
		kv, next, err := c.HScan(ctx, key, cursor, "", AuditHashPage).Result()
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if !seen[kv[i]] {
				seen[kv[i]] = true
				f(kv[i], kv[i+1])
			}
		}
		if cursor = next; cursor == 0 {
			return nil
		}
	}
}

// grantFields parses a grant record "state:amount:serial:deadline_ms".
func grantFields(rec string) (state byte, amount int64, serial string, ok bool) {
	parts := strings.Split(rec, ":")
	if len(parts) != 4 || len(parts[0]) != 1 {
		return 0, 0, "", false
	}
	amount, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return 0, 0, "", false
	}
	if _, err := strconv.ParseInt(parts[2], 10, 64); err != nil {
		return 0, 0, "", false
	}
	if _, err := strconv.ParseInt(parts[3], 10, 64); err != nil {
		return 0, 0, "", false
	}
	return parts[0][0], amount, parts[2], true
}

func pairs(v []any) map[string]string {
	m := make(map[string]string, len(v)/2)
	for j := 0; j+1 < len(v); j += 2 {
		m[str(v, j)] = str(v, j+1)
	}
	return m
}
