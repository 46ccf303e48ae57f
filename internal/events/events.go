// Package events carries rain's notices between instances on one Redis
// pub/sub channel: a pool was preloaded, stock came back to a sub-pool. It
// owns the wire format, publishing, and the one subscriber; package known
// and package soldout only hand it handlers.
//
// A notice is published on every shard and every instance subscribes on
// every shard, so a notice gets through while any one shard links the two.
// The price is that a handler sees each notice once per shard: handlers must
// be idempotent. Pub/sub delivers at most once: a notice published while an
// instance's link to a shard is down is lost on that link (go-redis
// resubscribes by itself when the shard is back). Every consumer therefore
// has a bound of its own on staleness: known lists the pool registries every
// second, and soldout trusts a mark for at most a second.
//
// Wire format, one notice per message, fields separated by one space:
//
//	pool <id>            a pool was preloaded: its id now exists
//	stock <pool> <j>     sub-pool j (decimal, ≥ 0) of pool changed in a way
//	                     local answers must hear: stock came back to it (a
//	                     release, an untake), or it gained a holder (an adopt)
//	state <id>           the pool's life moved on: it was ended by the
//	                     operator, or closed; what an instance keeps of it
//	                     lapses
//
// Ids are non-empty and contain no space or control character.
package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Channel is the one channel notices travel on. The Lua scripts that return
// stock (internal/lua) publish on it by this name.
const Channel = "rain:events"

// ErrMalformed is returned by Parse for a message that is not a notice, and
// by Publish for an Event that would not be one.
var ErrMalformed = errors.New("events: malformed message")

// Kind tells notices apart.
type Kind uint8

const (
	// Pool says that pool Event.Pool was preloaded.
	Pool Kind = iota + 1
	// Stock says that stock came back to sub-pool Event.Sub of pool
	// Event.Pool, or that it gained a holder: local answers about it lapse.
	Stock
	// State says that pool Event.Pool was ended or closed: what an instance
	// keeps of it (its record, local answers) lapses.
	State
)

// Event is one notice.
type Event struct {
	Kind Kind
	Pool string // the pool id
	Sub  int    // the sub-pool index; Stock only
}

// String returns e in the wire format.
func (e Event) String() string {
	switch e.Kind {
	case Pool:
		return "pool " + e.Pool
	case Stock:
		return "stock " + e.Pool + " " + strconv.Itoa(e.Sub)
	case State:
		return "state " + e.Pool
	}
	return fmt.Sprintf("kind%d %s %d", e.Kind, e.Pool, e.Sub)
}

// Parse decodes one message. It accepts exactly what Event.String produces
// for a valid Event, so Parse(s) succeeding means Parse(s).String() == s.
func Parse(s string) (Event, error) {
	kind, rest, _ := strings.Cut(s, " ")
	switch kind {
	case "pool", "state":
		if validID(rest) {
			k := Pool
			if kind == "state" {
				k = State
			}
			return Event{Kind: k, Pool: rest}, nil
		}
	case "stock":
		pool, sub, _ := strings.Cut(rest, " ")
		if j, ok := parseIndex(sub); ok && validID(pool) {
			return Event{Kind: Stock, Pool: pool, Sub: j}, nil
		}
	}
	return Event{}, fmt.Errorf("%w: %q", ErrMalformed, s)
}

// validID reports whether id can travel as one field.
func validID(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] == 0x7f {
			return false
		}
	}
	return true
}

// parseIndex accepts a canonical decimal index: digits only, no leading
// zero, small enough for any int.
func parseIndex(s string) (int, bool) {
	if s == "" || len(s) > 9 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}

// Publish sends e on Channel through every client, in parallel. A shard that fails does not stop the others; the failures are
// returned joined, each naming its shard's address. An Event that would not
// parse is refused with ErrMalformed before anything is sent.
func Publish(ctx context.Context, clients []redis.UniversalClient, e Event) error {
	msg := e.String()
	if _, err := Parse(msg); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			if err := c.Publish(ctx, Channel, msg).Err(); err != nil {
				errs[i] = fmt.Errorf("publish %q on shard %d of %d: %w", msg, i+1, len(clients), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Config tunes Listen. Zero fields take the documented defaults.
type Config struct {
	// Logger reports malformed messages. Default: discard.
	Logger *slog.Logger
	// Buffer is how many messages per shard may wait for the handlers;
	// beyond it go-redis waits up to a minute, then drops the message.
	// Default 1024.
	Buffer int
	// Subscribed, when set, is called once for each shard whose
	// subscription the shard confirmed at the start (a shard down then is
	// subscribed to later, without a call): from then on no notice
	// published on that shard is missed while the link holds.
	Subscribed func()
}

// Handlers receive notices; a nil handler ignores its kind. They run on
// Listen's goroutines, one per shard, so they must be safe for concurrent
// use, idempotent (a notice arrives once per shard), and quick (a slow
// handler delays the later notices of its shard).
type Handlers struct {
	Pool  func(id string)
	Stock func(pool string, j int)
	State func(id string)
}

// Listen subscribes to Channel on every client and hands each notice to
// h until ctx is done; then it closes the subscriptions, waits for its
// goroutines and returns. A shard that is down at the start or restarts
// later is subscribed to when it answers again (go-redis reconnects and
// resubscribes by itself, and pings an idle subscription every 3s to notice a
// dead link). With no clients Listen returns at once.
func Listen(ctx context.Context, clients []redis.UniversalClient, cfg Config, h Handlers) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = 1024
	}
	if len(clients) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		// One goroutine per shard, so a shard slow to answer does not hold
		// up the others.
		wg.Go(func() {
			// Subscribe records the channel even when the shard does not
			// answer now; the subscription is made on the first connect.
			ps := c.Subscribe(ctx, Channel)
			// Closing ps on ctx's end also ends a Receive below that waits on
			// a shard which never confirms.
			stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
			defer stop()
			if cfg.Subscribed != nil {
				// The first message is the subscription's confirmation.
				if _, err := ps.Receive(ctx); err == nil {
					cfg.Subscribed()
				}
			}
			msgs := ps.Channel(redis.WithChannelSize(cfg.Buffer))
			// go-redis closes msgs once ps is closed.
			for m := range msgs {
				dispatch(m.Payload, h, cfg.Logger)
			}
		})
	}
	wg.Wait()
}

func dispatch(payload string, h Handlers, log *slog.Logger) {
	e, err := Parse(payload)
	if err != nil {
		log.Warn("events: dropped message", "err", err)
		return
	}
	switch e.Kind {
	case Pool:
		if h.Pool != nil {
			h.Pool(e.Pool)
		}
	case Stock:
		if h.Stock != nil {
			h.Stock(e.Pool, e.Sub)
		}
	case State:
		if h.State != nil {
			h.State(e.Pool)
		}
	}
}
