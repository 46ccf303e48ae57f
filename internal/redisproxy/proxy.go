// Package redisproxy is a RESP-aware TCP proxy for rain's fault tests: it
// sits between go-redis and a real redis-server and loses what a network
// loses. It can swallow the reply of a command that already ran at Redis
// (and reset the connection, as a broken link would), drop a command before
// it reaches Redis, swallow a fraction of all replies at random, or cut the
// client off altogether (a partition: from the shard's side, a client whose
// process died), at once or right after a given command has run.
//
// It pairs replies with commands: it parses the commands a client sends
// (RESP arrays of bulk strings, as go-redis writes them) and the replies
// Redis sends back, and matches them in order, which Redis guarantees per
// connection. A connection that enters pub/sub (SUBSCRIBE, PSUBSCRIBE,
// SSUBSCRIBE), MONITOR or CLIENT REPLY breaks that pairing; from then on its
// bytes pass through untouched. RESP3 pushes are forwarded unpaired.
//
// For tests only: every fault rule is safe to change while traffic flows.
package redisproxy

import (
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// Match selects commands; cmd is the argv with cmd[0] upper-cased.
type Match func(cmd []string) bool

// Command matches every command named name (case-insensitive).
func Command(name string) Match {
	name = strings.ToUpper(name)
	return func(cmd []string) bool { return len(cmd) > 0 && cmd[0] == name }
}

// Script matches EVALSHA of the script with this SHA1 (how go-redis runs a
// script once the shard has it cached).
func Script(sha string) Match {
	return func(cmd []string) bool {
		return len(cmd) > 1 && (cmd[0] == "EVALSHA" && strings.EqualFold(cmd[1], sha))
	}
}

// Proxy forwards connections to one Redis address. Create it with Start.
type Proxy struct {
	// Addr is where clients connect: 127.0.0.1 and a free port.
	Addr string

	target string
	ln     net.Listener
	wg     sync.WaitGroup // accept loop and every connection's goroutines

	mu       sync.Mutex     // guards the fields below
	conns    map[*conn]bool // open connections
	replies  []*rule        // reply-drop rules, in the order added
	requests []*rule        // request-drop rules
	cuts     []*cut         // partition triggers, in the order added
	cutOff   bool           // partitioned: nothing reaches Redis
	loss     float64        // fraction of replies swallowed at random
	delay    time.Duration  // how long a reply matching slow is held before it is forwarded
	slow     Match          // see SetReplyDelay
	rng      *rand.Rand     // draws for loss
	stats    Stats          // what was done
	log      []Exchange     // every paired command and reply, when recording
	record   bool           // whether log is kept
	closed   bool           // Close was called
}

// rule drops the next n matching replies or requests.
type rule struct {
	match Match
	n     int
}

// cut partitions the proxy on the reply of the nth matching command.
type cut struct {
	match Match
	n     int
	then  func()
}

// Stats counts what the proxy did.
type Stats struct {
	Accepted         int            // client connections accepted
	Commands         map[string]int // by command name: forwarded to Redis
	RepliesSwallowed map[string]int // by command name: ran at Redis, reply lost
	RequestsDropped  map[string]int // by command name: never reached Redis
}

// Exchange is one command and its reply as Redis sent it (raw RESP).
type Exchange struct {
	Cmd       []string
	Reply     []byte
	Swallowed bool
}

// Start listens on 127.0.0.1:0 and forwards to target until tb ends.
func Start(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redisproxy: listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[*conn]bool{},
		rng: rand.New(rand.NewPCG(1, 2))}
	p.stats.Commands = map[string]int{}
	p.stats.RepliesSwallowed = map[string]int{}
	p.stats.RequestsDropped = map[string]int{}
	p.wg.Go(p.accept)
	tb.Cleanup(p.Close)
	return p
}

// DropReplies swallows the replies of the next n commands that match:
// each ran at Redis, its reply never reaches the client, and the client's
// connection is reset (with the rest of its pipeline's replies).
func (p *Proxy) DropReplies(m Match, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replies = append(p.replies, &rule{match: m, n: n})
}

// DropRequests drops the next n commands that match before they reach
// Redis, and resets the client's connection: they never ran.
func (p *Proxy) DropRequests(m Match, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests = append(p.requests, &rule{match: m, n: n})
}

// SetReplyDelay holds the reply to every command that matches m until d
// after the command was sent to Redis (the replies after it on the same
// connection behind it): a shard that answers every command, a pipeline's
// at once, d after it came (a slow disk, a busy machine). A d of 0 turns
// it off.
func (p *Proxy) SetReplyDelay(m Match, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow, p.delay = m, d
}

// SetReplyLoss swallows each reply with probability rate (as DropReplies
// does), drawn from a generator seeded with seed; 0 turns it off.
func (p *Proxy) SetReplyLoss(rate float64, seed uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.loss = rate
	p.rng = rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
}

// Partition cuts the client off the shard: every connection is reset, and
// from now on a connection is reset as soon as it is accepted, so nothing
// reaches Redis until Heal. To the shard it is a client whose process has
// died; to the client, a shard it cannot reach.
func (p *Proxy) Partition() {
	p.mu.Lock()
	p.cutOff = true
	p.mu.Unlock()
	p.ResetConns()
}

// Heal ends a partition: connections are forwarded again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutOff = false
}

// Partitioned reports whether the proxy is partitioned now.
func (p *Proxy) Partitioned() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cutOff
}

// PartitionAfter partitions the proxy when the reply of the nth command
// matching m comes back from Redis: that command ran, its reply is lost, and
// no command the client sends after it reaches Redis (one already on its way
// in the same pipeline has run, as it would have before a crash). then,
// when not nil, runs first, before the client can learn anything: to
// partition the client's other proxies at the same moment, as one process
// dying cuts all its connections.
func (p *Proxy) PartitionAfter(m Match, n int, then func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, &cut{match: m, n: n, then: then})
}

// Record keeps every exchange from now on (see Exchanges).
func (p *Proxy) Record() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record = true
}

// Exchanges returns the commands and replies recorded so far, in the order
// their replies came back.
func (p *Proxy) Exchanges() []Exchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Exchange(nil), p.log...)
}

// Stats returns what the proxy did so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Stats{Accepted: p.stats.Accepted, Commands: map[string]int{}, RepliesSwallowed: map[string]int{}, RequestsDropped: map[string]int{}}
	for k, v := range p.stats.Commands {
		st.Commands[k] = v
	}
	for k, v := range p.stats.RepliesSwallowed {
		st.RepliesSwallowed[k] = v
	}
	for k, v := range p.stats.RequestsDropped {
		st.RequestsDropped[k] = v
	}
	return st
}

// ResetStats zeroes the counters.
func (p *Proxy) ResetStats() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats = Stats{Accepted: p.stats.Accepted, Commands: map[string]int{},
		RepliesSwallowed: map[string]int{}, RequestsDropped: map[string]int{}}
}

// Calls is the number of commands forwarded, of every name.
func (s Stats) Calls() int {
	n := 0
	for _, v := range s.Commands {
		n += v
	}
	return n
}

// Swallowed is the number of replies swallowed so far, of every command.
func (s Stats) Swallowed() int {
	n := 0
	for _, v := range s.RepliesSwallowed {
		n += v
	}
	return n
}

// ResetConns closes every open connection, as a network blip would.
func (p *Proxy) ResetConns() {
	p.mu.Lock()
	cs := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.reset()
	}
}

// Close stops accepting, closes every connection and waits for all the
// proxy's goroutines. It is safe to call more than once.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.ResetConns()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &conn{p: p, client: client.(*net.TCPConn), server: server.(*net.TCPConn)}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.reset()
			return
		}
		if p.cutOff {
			p.mu.Unlock()
			c.reset()
			continue
		}
		p.conns[c] = true
		p.stats.Accepted++
		p.mu.Unlock()
		p.wg.Go(c.upstream)
		p.wg.Go(c.downstream)
	}
}
