package settle

// This file is what a worker remembers of the grants it settled whose
// entries are still pending (Worker.marks): later passes settle the rest of
// such an entry without paying or counting those grants again, and a grant
// it paid that its shard no longer holds confirmed is left for an operator.

import (
	"sync"
)

// outcome is what this worker did before with a grant of an entry still
// pending (marks).
type outcome uint8

const (
	notSeen    outcome = iota
	paidOut            // confirmed and delivered
	expiredOut         // released at its deadline before its confirm: not paid
	unmatched          // no grant matches it: an anomaly, counted
)

// maxMarks bounds marks. Marks leave with their entry's acknowledgment by
// this worker, and otherwise once their entry is gone from its outbox (an
// acknowledgment that applied though its reply was lost; another worker's,
// after it took the entry over; an operator's): see
// Worker.forgetAcknowledged. An entry another worker holds keeps its marks,
// for it may come back to this one. At the bound a grant is not marked: its
// entry, read again, pays it again (the sinks dedupe) and counts it again,
// and, should its shard lose the grant's confirm meanwhile, takes it for
// released unpaid (unless the sink records unpaid grants, and refuses:
// RecordsUnpaid). Only entries whose settling met a failure hold marks
// past their batch, so the bound is far above what a failure leaves.
const maxMarks = 1 << 16

// maxMarkChecks bounds the marked entries one look up of a shard's
// (Worker.forgetGoneEntries) checks; the next look checks others.
const maxMarkChecks = 64

// marks holds, per outbox and entry, what became of the grants this worker
// settled of entries still pending to it: of an entry of several grants,
// every grant settled while another is not (its delivery failed, or it is
// left for an operator); of an entry of one grant, the grant when the
// entry's acknowledgment failed.
type marks struct {
	mu sync.Mutex
	by map[outboxOf]map[string]map[int64]outcome // outbox -> entry id -> serial -> outcome
	n  int                                       // grants marked
}

// outboxOf names an outbox: its shard, and its stream's key there.
type outboxOf struct{ shard, stream string }

// get is what became of grant serial of entry id of outbox o (notSeen:
// not marked).
func (m *marks) get(o outboxOf, id string, serial int64) outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return notSeen
	}
	return m.by[o][id][serial]
}

// set marks grant serial of entry id of outbox o with what, within
// maxMarks.
func (m *marks) set(o outboxOf, id string, serial int64, what outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[o]
	e := s[id]
	if _, had := e[serial]; !had {
		if m.n >= maxMarks {
			return
		}
		m.n++
	}
	if m.by == nil {
		m.by = map[outboxOf]map[string]map[int64]outcome{}
	}
	if s == nil {
		s = map[string]map[int64]outcome{}
		m.by[o] = s
	}
	if e == nil {
		e = map[int64]outcome{}
		s[id] = e
	}
	e[serial] = what
}

// drop forgets the marks of the entries ids of outbox o (acknowledged, or
// gone).
func (m *marks) drop(o outboxOf, ids []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[o]
	for _, id := range ids {
		m.n -= len(s[id])
		delete(s, id)
	}
	if s != nil && len(s) == 0 {
		delete(m.by, o)
	}
}

// dropOutbox forgets the marks of outbox o, gone with its pool.
func (m *marks) dropOutbox(o outboxOf) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.by[o] {
		m.n -= len(e)
	}
	delete(m.by, o)
}

// entries returns up to max of the entries of outbox o with marks, none of
// those in skip.
func (m *marks) entries(o outboxOf, skip map[string]bool, max int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id := range m.by[o] {
		if len(ids) == max {
			break
		}
		if !skip[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// unlisted returns up to max of the marked entries of the named shard's
// outboxes, none of those in listed, to look up.
func (m *marks) unlisted(shard string, listed map[string]bool, max int) []markLookup {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []markLookup
	for o, s := range m.by {
		if o.shard != shard || listed[o.stream] {
			continue
		}
		l := markLookup{stream: o.stream}
		for id := range s {
			if max == 0 {
				break
			}
			l.ids, max = append(l.ids, id), max-1
		}
		if len(l.ids) > 0 {
			out = append(out, l)
		}
		if max == 0 {
			break
		}
	}
	return out
}

// count is how many grants are marked.
func (m *marks) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}
