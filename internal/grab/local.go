package grab

// The answers rain gives without Redis, all of them, and what keeps them
// true.
//
// A grab is answered without a trip to a shard in exactly four cases:
//
//  1. not_found, for a pool id the known-pools filter rules out (a Bloom
//     filter: no false negatives). The filter holds every pool in the
//     registries and learns a new pool at once (the preload's notice on
//     rain:events, or this instance's own preload: catalog.OnOpen), and the
//     registries are read again every 2 s. It answers only once warm (see
//     Run): an instance just started never answers not_found for a pool
//     preloaded a moment before. A false positive costs one trip to the
//     shards, which then say the pool does not exist. A pool preloaded on
//     another instance a moment ago may not be in it yet (its notice on
//     the way): so up to unknownLookups ids a second that the filter rules
//     out are still looked up on the shards, and a pool found there joins
//     the filter; past that (a flood of made-up ids), not_found at once.
//  2. not_started, for a pool whose record is not open yet (still loading):
//     the record is read from the shards on every such grab.
//  3. ended, for a pool whose record says it is closing or closed (its
//     keys are freed; the record never changes again once closed).
//  4. sold_out, when every sub-pool of the pool answered empty within the
//     last second (internal/soldout), no release has returned stock since
//     (a release's notice on rain:events forgets the sub-pool at once), and
//     this user holds no grant there: the pool's grant holders, and the
//     users whose spill is in flight (a reservation at their home, which an
//     adopt may still turn into a grant), are read once into a Bloom
//     filter, so a user it rules out cannot hold one (a sold-out pool gains
//     no holder but through a spill already reserved, until stock comes
//     back, which drops the filter). A possible holder, or a 0.1% false
//     positive, goes to Redis and gets their grant back. Not once the
//     pool's window is over, or an operator ended it (its notice drops the
//     marks): Redis then answers ended.
//
// Every other grab goes to the user's home sub-pool. None of the four can
// grant, refuse or hide a grant that exists: at worst a notice lost for up
// to a second makes a grab go to Redis when it need not, or answers
// sold_out for the second after stock came back (the flood after a
// sell-out), never "no such pool" for a pool that exists.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bits-and-blooms/bloom/v3"

	"rain/internal/events"
	"rain/internal/known"
	"rain/internal/limit"
	"rain/internal/soldout"
)

// unknownLookups is how many pool ids a second the known-pools filter rules
// out that are still looked up on the shards (case 1).
const unknownLookups = 20

// local is the state behind the answers given without Redis.
type local struct {
	known   *known.Filter  // pool ids that may exist
	lookups *limit.Limiter // ids it rules out that are looked up anyway
	warm    atomic.Bool    // known may answer not_found (see Run)
	empty   *soldout.Cache // sub-pools that answered empty lately
	holders sync.Map       // pool id -> *holderState, for sold-out pools
}

// unknown reports whether poolID is surely no pool (case 1): the filter
// rules it out, and the lookups of such ids this second are spent.
func (l *local) unknown(poolID string) bool {
	if !l.warm.Load() || l.known.MayContain(poolID) {
		return false
	}
	ok, _ := l.lookups.Allow("", time.Now())
	return !ok
}

// soldOutHere reports whether the pool is known sold out and userID surely
// holds no grant in it (case 4). When the holders are not known yet it
// starts reading them and answers false (ask Redis).
func (s *Service) soldOutHere(p *poolView, userID string) bool {
	if !s.local.empty.AllEmpty(p.rec.ID(), len(p.keys)) {
		return false
	}
	if end := p.rec.Spec.EndsAt; end != nil && !time.Now().Before(*end) {
		return false // ended by its window: Redis says so (held grants come back)
	}
	st := s.local.holderState(p.rec.ID())
	set := st.set.Load()
	if set == nil || time.Since(set.built) > holdersTTL {
		s.buildHolders(p, st)
		return false
	}
	return !set.filter.TestString(userID)
}

// holdersTTL: a sold-out pool's holders are read again after it, in case
// the notice that stock came back was lost.
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

func (l *local) holderState(poolID string) *holderState {
	if st, ok := l.holders.Load(poolID); ok {
		return st.(*holderState)
	}
	st, _ := l.holders.LoadOrStore(poolID, &holderState{})
	return st.(*holderState)
}

// stockBack forgets what made sub-pool j of the pool look sold out: stock
// came back to it (a release, an undone spill) or it gained a holder.
func (l *local) stockBack(poolID string, j int) {
	l.empty.Forget(poolID, j)
	st := l.holderState(poolID)
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
				"pool_id", p.rec.ID(), "err", err)
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

// readHolders scans every sub-pool's grants and spill reservations.
func (s *Service) readHolders(ctx context.Context, p *poolView) (*holderSet, error) {
	var n uint
	for j := range p.keys {
		for _, key := range []string{p.keys[j].Grants, p.keys[j].Reserve} {
			l, err := p.clients[j].HLen(ctx, key).Result()
			if err != nil {
				return nil, err
			}
			n += uint(l)
		}
	}
	f := bloom.NewWithEstimates(max(n, 1000), 0.001)
	built := time.Now()
	for j := range p.keys {
		// Reservations first: one adopted while the grants are scanned is
		// then in the filter either way.
		for _, key := range []string{p.keys[j].Reserve, p.keys[j].Grants} {
			var cursor uint64
			for {
				kv, next, err := p.clients[j].HScan(ctx, key, cursor, "", 10_000).Result()
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
	}
	return &holderSet{filter: f, built: built}, nil
}

// Run keeps this instance's local answers current until ctx ends: it hears
// rain:events on every shard (a new pool is known at once; stock returned to
// a sub-pool, or a new holder, makes it no longer known empty and drops its
// holders; a pool ended or closed is forgotten, its record read again) and
// lists the pool registries every 2 s, so a lost notice costs at most that
// (a pool's record kept by the catalog lapses within 2 s as well). Run it in one goroutine beside serving grabs; it returns
// when ctx ends.
//
// The known-pools filter answers unknown pools without Redis only once it
// is warm: after a registry read that began when every shard had confirmed
// its subscription to the notices (so a pool preloaded before that read is
// in it, and one preloaded after is notified), or after the second read
// when some shard never confirmed (then a lost notice is covered by the
// next read, as ever). Until then an unknown pool is looked up on the
// shards: an instance just started never answers not_found for a pool
// preloaded a moment before.
func (s *Service) Run(ctx context.Context) {
	shards := int64(len(s.shards.Names()))
	var subscribed, reads atomic.Int64
	allSubscribed := make(chan struct{})
	list := func(ctx context.Context) ([]string, error) {
		ready := subscribed.Load() == shards || reads.Load() >= 1
		ids, err := s.cat.ReadListInTurn(ctx)
		if err == nil {
			if reads.Add(1); ready {
				s.local.warm.Store(true)
			}
		}
		return ids, err
	}
	refresh := known.NewSync(s.local.known, list, known.SyncConfig{Logger: s.log})
	var wg sync.WaitGroup
	wg.Go(func() {
		// The first read waits for the subscriptions (a second at most:
		// a shard down at the start is subscribed to when it answers).
		select {
		case <-allSubscribed:
		case <-time.After(time.Second):
		case <-ctx.Done():
			return
		}
		refresh.Run(ctx)
	})
	events.Listen(ctx, s.shards.Clients(), events.Config{Logger: s.log, Subscribed: func() {
		if subscribed.Add(1) == shards {
			close(allSubscribed)
		}
	}}, events.Handlers{
		Pool:  s.local.known.Add,
		Stock: s.local.stockBack,
		State: s.forget, // ended or closed: the view, the record and the local answers lapse
	})
	wg.Wait()
}
