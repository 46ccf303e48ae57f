package grab

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
)

// A sold-out pool is answered locally, but a user who holds a grant must
// still get it back (already_granted), and holders are known only to Redis.
// So once every sub-pool of a pool is known empty, the instance reads the
// pool's grant holders once (HSCAN, in the background) into a bloom filter:
// a user it rules out is answered sold_out without Redis; a user it may hold
// (a holder, or a 0.1% false positive) goes to Redis as usual. A sold-out
// pool gains no holder until stock comes back, and stock coming back (a
// release, an undone spill) drops the filter (rain:events); the filter also
// lapses after holdersTTL, in case that notice was lost.
const holdersTTL = 5 * time.Second

// holderSet is the grant holders of one sold-out pool.
type holderSet struct {
	filter *bloom.BloomFilter // immutable once stored
	built  time.Time
}

// holderState is one pool's entry; gen counts stock notices, so a build that
// raced with one is not stored.
type holderState struct {
	set      atomic.Pointer[holderSet]
	gen      atomic.Int64
	building atomic.Bool
}

func (s *Service) holderState(poolID string) *holderState {
	if st, ok := s.holders.Load(poolID); ok {
		return st.(*holderState)
	}
	st, _ := s.holders.LoadOrStore(poolID, &holderState{})
	return st.(*holderState)
}

// surelyNotHolder reports whether userID certainly holds no grant in the
// sold-out pool p. When the holders are not known yet it starts reading them
// and answers false (ask Redis).
func (s *Service) surelyNotHolder(p *poolView, userID string) bool {
	st := s.holderState(p.rec.spec.PoolID)
	set := st.set.Load()
	if set == nil || time.Since(set.built) > holdersTTL {
		s.buildHolders(p, st)
		return false
	}
	return !set.filter.TestString(userID)
}

// dropHolders forgets the pool's holders: stock came back to it.
func (s *Service) dropHolders(poolID string, _ int) {
	st := s.holderState(poolID)
	st.gen.Add(1)
	st.set.Store(nil)
}

// buildHolders reads the pool's holders in the background, once at a time.
func (s *Service) buildHolders(p *poolView, st *holderState) {
	if !st.building.CompareAndSwap(false, true) {
		return
	}
	gen := st.gen.Load()
	started := s.goBackground(func() {
		defer st.building.Store(false)
		ctx, cancel := context.WithTimeout(s.stopCtx, 30*time.Second)
		defer cancel()
		set, err := s.readHolders(ctx, p)
		if err != nil {
			s.log.Warn("reading the grant holders of a sold-out pool failed; asking Redis meanwhile",
				"pool_id", p.rec.spec.PoolID, "err", err)
			return // the next sold-out grab tries again
		}
		if st.gen.Load() != gen {
			return // stock came back meanwhile
		}
		st.set.Store(set)
	})
	if !started {
		st.building.Store(false)
	}
}

// readHolders scans every sub-pool's grants hash.
func (s *Service) readHolders(ctx context.Context, p *poolView) (*holderSet, error) {
	var n uint
	for j := range p.keys {
		l, err := p.clients[j].HLen(ctx, p.keys[j].Grants).Result()
		if err != nil {
			return nil, err
		}
		n += uint(l)
	}
	f := bloom.NewWithEstimates(max(n, 1000), 0.001)
	built := time.Now()
	for j := range p.keys {
		var cursor uint64
		for {
			kv, next, err := p.clients[j].HScan(ctx, p.keys[j].Grants, cursor, "", 10_000).Result()
			if err != nil {
				return nil, err
			}
			for i := 0; i < len(kv); i += 2 {
				f.AddString(kv[i]) // released grants too: erring towards Redis is safe
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return &holderSet{filter: f, built: built}, nil
}
