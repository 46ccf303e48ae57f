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
// entry, read again, pays it again (the sinks dedupe) and counts it again.
const maxMarks = 1 << 16

// maxMarkChecks bounds the entries of one outbox whose marks one look
// checks (Worker.forgetAcknowledged); the next look checks others.
const maxMarkChecks = 64

// marks holds, per outbox and entry, what became of the grants this worker
// settled of entries still pending to it: of an entry of several grants,
// every grant settled while another is not (its delivery failed, or it is
// left for an operator); of an entry of one grant, the grant when the
// entry's acknowledgment failed.
type marks struct {
	mu sync.Mutex
	by map[string]*streamMarks // by stream
	n  int                     // grants marked
}

// streamMarks is the marks of one outbox: its shard's name, and its
// entries' (entry id -> serial -> outcome).
type streamMarks struct {
	shard string
	ids   map[string]map[int64]outcome
}

// get is what became of grant serial of entry id of stream (notSeen: not
// marked).
func (m *marks) get(stream, id string, serial int64) outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return notSeen
	}
	if s := m.by[stream]; s != nil {
		return s.ids[id][serial]
	}
	return notSeen
}

// set marks grant serial of entry id of stream, an outbox of the named
// shard, with o, within maxMarks.
func (m *marks) set(shard, stream, id string, serial int64, o outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[stream]
	var e map[int64]outcome
	if s != nil {
		e = s.ids[id]
	}
	if _, had := e[serial]; !had {
		if m.n >= maxMarks {
			return
		}
		m.n++
	}
	if m.by == nil {
		m.by = map[string]*streamMarks{}
	}
	if s == nil {
		s = &streamMarks{shard: shard, ids: map[string]map[int64]outcome{}}
		m.by[stream] = s
	}
	if e == nil {
		e = map[int64]outcome{}
		s.ids[id] = e
	}
	e[serial] = o
}

// drop forgets the marks of the entries ids of stream (acknowledged).
func (m *marks) drop(stream string, ids []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[stream]
	if s == nil {
		return
	}
	for _, id := range ids {
		m.n -= len(s.ids[id])
		delete(s.ids, id)
	}
	if len(s.ids) == 0 {
		delete(m.by, stream)
	}
}

// dropStream forgets the marks of an outbox gone with its pool.
func (m *marks) dropStream(stream string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.by[stream]; s != nil {
		for _, e := range s.ids {
			m.n -= len(e)
		}
	}
	delete(m.by, stream)
}

// entries returns up to max of the entries of stream with marks, none of
// those in skip.
func (m *marks) entries(stream string, skip map[string]bool, max int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[stream]
	if s == nil {
		return nil
	}
	var ids []string
	for id := range s.ids {
		if len(ids) == max {
			break
		}
		if !skip[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// streamsOf returns the outboxes of the named shard with marks, none of
// those in skip.
func (m *marks) streamsOf(shard string, skip map[string]bool) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for stream, s := range m.by {
		if s.shard == shard && !skip[stream] {
			out = append(out, stream)
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
