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
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
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

// takeRule reports whether a rule in rules matches cmd, and uses one of
// its n. Called with p.mu held.
func takeRule(rules []*rule, cmd []string) bool {
	for _, r := range rules {
		if r.n > 0 && r.match(cmd) {
			r.n--
			return true
		}
	}
	return false
}

// takeCut returns the cut that cmd's reply fires (its nth match), if any.
// Called with p.mu held.
func takeCut(cuts []*cut, cmd []string) *cut {
	for _, c := range cuts {
		if c.n > 0 && c.match(cmd) {
			if c.n--; c.n == 0 {
				return c
			}
		}
	}
	return nil
}

// conn is one client connection and its connection to Redis.
type conn struct {
	p              *Proxy
	client, server *net.TCPConn

	mu          sync.Mutex // guards pending and passthrough
	pending     [][]string // commands sent, replies not yet seen
	passthrough bool       // pub/sub or MONITOR: no pairing any more
	once        sync.Once  // guards the reset
}

// reset closes both sides; the client sees a reset (RST), not a clean close.
func (c *conn) reset() {
	c.once.Do(func() {
		_ = c.client.SetLinger(0)
		_ = c.client.Close()
		_ = c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// upstream reads commands from the client and forwards them to Redis.
func (c *conn) upstream() {
	defer c.reset()
	r := bufio.NewReaderSize(c.client, 64<<10)
	for {
		raw, cmd, err := readCommand(r)
		if err != nil {
			return
		}
		c.mu.Lock()
		pass := c.passthrough
		if !pass {
			c.p.mu.Lock()
			drop := c.p.cutOff || takeRule(c.p.requests, cmd)
			if drop {
				c.p.stats.RequestsDropped[cmd[0]]++
			} else {
				c.p.stats.Commands[cmd[0]]++
			}
			c.p.mu.Unlock()
			if drop {
				c.mu.Unlock()
				return // reset: neither this command nor any after it runs
			}
			c.pending = append(c.pending, cmd)
			if endsPairing(cmd) {
				c.passthrough = true
			}
		}
		if pass {
			c.p.mu.Lock()
			cutOff := c.p.cutOff
			c.p.stats.Commands[cmd[0]]++
			c.p.mu.Unlock()
			if cutOff {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		if _, err := c.server.Write(raw); err != nil {
			return
		}
	}
}

// downstream reads replies from Redis, pairs each with its command, and
// forwards or swallows it.
func (c *conn) downstream() {
	defer c.reset()
	r := bufio.NewReaderSize(c.server, 64<<10)
	for {
		c.mu.Lock()
		pass := c.passthrough && len(c.pending) <= 1
		c.mu.Unlock()
		if pass {
			// The replies to commands before SUBSCRIBE have been paired;
			// from here on, bytes as they come.
			_, _ = io.Copy(c.client, r)
			return
		}
		raw, err := readReply(r)
		if err != nil {
			return
		}
		if raw[0] == '>' { // a RESP3 push answers no command
			if _, err := c.client.Write(raw); err != nil {
				return
			}
			continue
		}
		c.mu.Lock()
		var cmd []string
		if len(c.pending) > 0 {
			cmd, c.pending = c.pending[0], c.pending[1:]
		}
		c.mu.Unlock()
		swallow := false
		var fire *cut
		if cmd != nil {
			p := c.p
			p.mu.Lock()
			fire = takeCut(p.cuts, cmd)
			if fire != nil {
				p.cutOff = true
			}
			swallow = p.cutOff || takeRule(p.replies, cmd) || (p.loss > 0 && p.rng.Float64() < p.loss)
			if swallow {
				p.stats.RepliesSwallowed[cmd[0]]++
			}
			if p.record {
				p.log = append(p.log, Exchange{Cmd: cmd, Reply: raw, Swallowed: swallow})
			}
			p.mu.Unlock()
		}
		if fire != nil {
			if fire.then != nil {
				fire.then()
			}
			c.p.ResetConns()
		}
		if swallow {
			return // reset: the reply and everything after it are lost
		}
		if _, err := c.client.Write(raw); err != nil {
			return
		}
	}
}

// endsPairing reports whether replies stop being one per command after cmd.
func endsPairing(cmd []string) bool {
	switch cmd[0] {
	case "SUBSCRIBE", "SSUBSCRIBE", "PSUBSCRIBE", "MONITOR":
		return true
	case "CLIENT":
		return len(cmd) > 1 && strings.EqualFold(cmd[1], "REPLY")
	}
	return false
}

// errProtocol is returned for bytes that are not RESP.
var errProtocol = errors.New("redisproxy: not RESP")

// readCommand reads one command: a RESP array of bulk strings, or an inline
// command line. It returns the raw bytes and the argv, argv[0] upper-cased.
func readCommand(r *bufio.Reader) (raw []byte, cmd []string, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, nil, err
	}
	raw = line
	if len(line) == 0 || line[0] != '*' {
		cmd = strings.Fields(string(line))
		if len(cmd) == 0 {
			cmd = []string{""}
		}
		cmd[0] = strings.ToUpper(cmd[0])
		return raw, cmd, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(line[1:])))
	if err != nil || n < 0 {
		return nil, nil, fmt.Errorf("%w: array header %q", errProtocol, line)
	}
	cmd = make([]string, 0, n)
	for range n {
		hdr, err := r.ReadBytes('\n')
		if err != nil {
			return nil, nil, err
		}
		if len(hdr) == 0 || hdr[0] != '$' {
			return nil, nil, fmt.Errorf("%w: bulk header %q", errProtocol, hdr)
		}
		size, err := strconv.Atoi(strings.TrimSpace(string(hdr[1:])))
		if err != nil || size < 0 {
			return nil, nil, fmt.Errorf("%w: bulk header %q", errProtocol, hdr)
		}
		body := make([]byte, size+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, nil, err
		}
		raw = append(raw, hdr...)
		raw = append(raw, body...)
		cmd = append(cmd, string(body[:size]))
	}
	if len(cmd) == 0 {
		cmd = []string{""}
	}
	cmd[0] = strings.ToUpper(cmd[0])
	return raw, cmd, nil
}

// readReply reads one complete RESP2 or RESP3 reply and returns its bytes.
func readReply(r *bufio.Reader) ([]byte, error) {
	var raw []byte
	var read func() error
	read = func() error {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return err
		}
		raw = append(raw, line...)
		if len(line) < 3 {
			return fmt.Errorf("%w: short line %q", errProtocol, line)
		}
		body := strings.TrimSpace(string(line[1:]))
		switch line[0] {
		case '+', '-', ':', '_', ',', '#', '(':
			return nil
		case '$', '!', '=':
			n, err := strconv.Atoi(body)
			if err != nil {
				return fmt.Errorf("%w: %q", errProtocol, line)
			}
			if n < 0 {
				return nil // null bulk string
			}
			buf := make([]byte, n+2)
			if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			raw = append(raw, buf...)
			return nil
		case '*', '~', '>', '%', '|':
			n, err := strconv.Atoi(body)
			if err != nil {
				return fmt.Errorf("%w: %q", errProtocol, line)
			}
			if line[0] == '%' || line[0] == '|' {
				n *= 2
			}
			for range max(n, 0) { // a null array (*-1) has no elements
				if err := read(); err != nil {
					return err
				}
			}
			if line[0] == '|' { // an attribute precedes the reply it annotates
				return read()
			}
			return nil
		}
		return fmt.Errorf("%w: type %q", errProtocol, line[0])
	}
	if err := read(); err != nil {
		return nil, err
	}
	return raw, nil
}
