package grab

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/lua"
)

// Batching of claims: concurrent grabs bound for one shard share a pipelined
// round trip. Each shard has a few lanes; a lane takes the first claim
// waiting, drains whatever else is queued (up to maxBatch), and sends them as
// one pipeline of EVALSHA claims. Under light load a batch is one claim and
// costs what a plain call costs; under a flood the batch grows while the
// previous one is in flight, and the syscalls per grab fall on both sides.
// Each claim is still its own atomic script: batching changes no semantics.
// go-redis sends a pipeline whose answers were lost again, whole; every claim
// answers a re-send as it answered the first run (same serial, same token),
// so a retried batch grants nothing twice.
const (
	// lanesPerShard: two pipelines in flight per shard. Measured with
	// scripts/bench.sh grab on 2 cores: 4 lanes gave 0.90–0.93× the
	// baseline, 1 lane 0.98×, 2 lanes 1.03–1.08× (fewer, fuller batches).
	lanesPerShard = 2
	maxBatch      = 128
	// batchTimeout bounds one pipelined round trip; a claim waits at most this.
	batchTimeout = 3 * time.Second
)

// claimReq is one claim in flight. Reused through reqPool.
type claimReq struct {
	ctx    context.Context
	keys   *lua.Keys
	user   string
	serial int64
	token  string // spill token, "" for pools of one sub-pool
	valid  int64  // spill reservation validity, ms
	res    lua.Claim
	err    error
	done   chan struct{} // capacity 1; receives once per use
}

var reqPool = sync.Pool{New: func() any { return &claimReq{done: make(chan struct{}, 1)} }}

// batcher runs the claims of one shard.
type batcher struct {
	c    *redis.Client
	reqs chan *claimReq
	stop <-chan struct{} // closed by Service.Close
}

func newBatcher(c *redis.Client, stop <-chan struct{}) *batcher {
	return &batcher{c: c, reqs: make(chan *claimReq, maxBatch*lanesPerShard), stop: stop}
}

// errNotSent wraps the error of a claim that never reached its shard.
var errNotSent = errors.New("claim not sent")

// claim queues a claim and waits for its answer. A claim whose ctx is done
// before its batch is sent does no Redis work (its error wraps errNotSent);
// once sent, the caller waits for the answer (bounded by batchTimeout), so
// an answer that arrives is never lost.
func (b *batcher) claim(ctx context.Context, k *lua.Keys, user string, serial int64, token string, valid int64) (lua.Claim, error) {
	r := reqPool.Get().(*claimReq)
	r.ctx, r.keys, r.user, r.serial, r.token, r.valid = ctx, k, user, serial, token, valid
	select {
	case b.reqs <- r:
	case <-ctx.Done():
		r.ctx, r.keys = nil, nil
		reqPool.Put(r)
		return lua.Claim{}, fmt.Errorf("%w: %w", errNotSent, ctx.Err())
	case <-b.stop:
		r.ctx, r.keys = nil, nil
		reqPool.Put(r)
		return lua.Claim{}, fmt.Errorf("%w: service closed", errNotSent)
	}
	<-r.done
	res, err := r.res, r.err
	r.ctx, r.keys, r.res, r.err = nil, nil, lua.Claim{}, nil
	reqPool.Put(r)
	return res, err
}

// lane serves batches until stop is closed. Claims still queued then are
// answered ErrUnavailable before it returns. (Service.Close comes after the
// last grab has returned, so none is queued after that.)
func (b *batcher) lane() {
	batch := make([]*claimReq, 0, maxBatch)
	cmds := make([]*redis.Cmd, 0, maxBatch)
	for {
		var first *claimReq
		select {
		case first = <-b.reqs:
		case <-b.stop:
			for {
				select {
				case r := <-b.reqs:
					r.err = fmt.Errorf("%w: service closed", errNotSent)
					r.done <- struct{}{}
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
	drain:
		for len(batch) < maxBatch {
			select {
			case r := <-b.reqs:
				batch = append(batch, r)
			default:
				break drain
			}
		}
		cmds = b.run(batch, cmds[:0])
	}
}

// run sends one batch and answers every claim in it.
func (b *batcher) run(batch []*claimReq, cmds []*redis.Cmd) []*redis.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	live := batch[:0] // filtered in place: live[i] is written after batch[i] is read
	pipe := b.c.Pipeline()
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.err = fmt.Errorf("%w: %w", errNotSent, err)
			r.done <- struct{}{}
			continue
		}
		live = append(live, r)
		cmds = append(cmds, lua.ClaimCmd(ctx, pipe, r.keys, r.user, r.serial, r.token, r.valid))
	}
	if len(live) == 0 {
		return cmds
	}
	_, _ = pipe.Exec(ctx) // errors are per command, read below
	var retry []*claimReq
	for i, r := range live {
		r.res, r.err = lua.ParseClaim(cmds[i])
		if lua.IsNoScript(r.err) {
			retry = append(retry, r)
			continue
		}
		r.done <- struct{}{}
	}
	if len(retry) > 0 {
		// A restarted shard has an empty script cache: load and run again.
		// Nothing ran for these claims, so running them again is safe.
		err := lua.LoadScripts(ctx, b.c)
		for _, r := range retry {
			if err == nil {
				r.res, r.err = lua.ClaimGrant(ctx, b.c, r.keys, r.user, r.serial, r.token, r.valid)
			} else {
				r.err = err
			}
			r.done <- struct{}{}
		}
	}
	return cmds
}
