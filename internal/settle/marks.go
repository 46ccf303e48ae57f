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

// maxMarks bounds marks. What it holds is of entries pending to this worker:
// marks leave with their entry's acknowledgment, and those of entries no
// longer pending to it (an acknowledgment that applied though its reply was
// lost, an entry another worker took over, or an operator cleared) with
// the next read of the worker's pending entries that begins past them
// (dropBefore). At the bound a grant is not marked: its entry, read again,
// pays it again (the sinks dedupe) and counts it again.
const maxMarks = 1 << 16

// marks holds, per outbox and entry, what became of the grants this worker
// settled of entries still pending to it: of an entry of several grants,
// every grant settled while another is not (its delivery failed, or it is
// left for an operator); of an entry of one grant, the grant when the
// entry's acknowledgment failed.
type marks struct {
	mu sync.Mutex
	by map[string]map[string]map[int64]outcome // stream -> entry id -> serial -> outcome
	n  int                                     // grants marked
}

// get is what became of grant serial of entry id of stream (notSeen: not
// marked).
func (m *marks) get(stream, id string, serial int64) outcome {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n == 0 {
		return notSeen
	}
	return m.by[stream][id][serial]
}

// set marks grant serial of entry id of stream with o, within maxMarks.
func (m *marks) set(stream, id string, serial int64, o outcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[stream]
	e := s[id]
	if _, had := e[serial]; !had {
		if m.n >= maxMarks {
			return
		}
		m.n++
	}
	if m.by == nil {
		m.by = map[string]map[string]map[int64]outcome{}
	}
	if s == nil {
		s = map[string]map[int64]outcome{}
		m.by[stream] = s
	}
	if e == nil {
		e = map[int64]outcome{}
		s[id] = e
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
		m.n -= len(s[id])
		delete(s, id)
	}
	if len(s) == 0 {
		delete(m.by, stream)
	}
}

// dropBefore forgets the marks of stream's entries before first, the first
// entry pending to this worker in a read of its pending entries from their
// start ("": it had none): they are not pending to it any more.
func (m *marks) dropBefore(stream, first string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.by[stream]
	for id, e := range s {
		if first == "" || idAfter(first, id) {
			m.n -= len(e)
			delete(s, id)
		}
	}
	if s != nil && len(s) == 0 {
		delete(m.by, stream)
	}
}

// dropStream forgets the marks of an outbox gone with its pool.
func (m *marks) dropStream(stream string) {
	m.dropBefore(stream, "")
}

// count is how many grants are marked.
func (m *marks) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n
}
