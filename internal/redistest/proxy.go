package redistest

// This file owns Proxy: a TCP proxy in front of one redis-server that
// understands enough RESP to pair every reply with the command it answers, so
// tests can lose a reply after its command ran, or drop a command before it
// runs, on a real server.
//
// Per client connection there are two goroutines. The request pump parses the
// client's stream into whole commands, records each in the connection's FIFO
// of commands awaiting replies, then forwards them. The reply pump scans the
// server's stream for reply boundaries without holding replies back: at the
// first byte of each reply it pairs the reply with the oldest pending command,
// decides once whether to swallow it, and otherwise forwards bytes as they
// arrive.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards client connections to one redis-server and injects faults
// into them by rule. Its methods are safe to call concurrently with traffic.
//
// A command is seen by rules as its argv: cmd[0] is the command name in upper
// case (go-redis sends it in lower case), the other arguments are exactly as
// sent. Inline commands (a line of text rather than a RESP array) are
// forwarded and their replies paired, but no rule ever sees them.
//
// Once a connection sends SUBSCRIBE, SSUBSCRIBE, PSUBSCRIBE, MONITOR or
// CLIENT REPLY, replies stop being one per command, so from that command's
// reply on the connection is passed through byte for byte and no rule
// applies to it. RESP3 push frames ('>') are forwarded without pairing.
type Proxy struct {
	// Addr is the proxy's host:port: point clients at it instead of the server.
	Addr string

	target string
	ln     *net.TCPListener
	cancel context.CancelFunc // aborts dials to target in flight
	wg     sync.WaitGroup     // the accept loop and one per client connection

	replyRules   atomic.Pointer[[]*rule] // copy on write under mu
	requestRules atomic.Pointer[[]*rule] // copy on write under mu
	loss         atomic.Pointer[loss]    // nil: no random reply loss

	mu     sync.Mutex // guards the fields below, and writers of the rule lists
	closed bool
	conns  map[*conn]struct{}
	stats  Stats
}

// Stats counts what a Proxy did. Maps are keyed by command name (cmd[0],
// upper case).
type Stats struct {
	// Conns is the number of client connections accepted.
	Conns int
	// SwallowedReplies counts replies swallowed after their command ran, by
	// DropReplies or SetReplyLoss.
	SwallowedReplies map[string]int
	// DroppedRequests counts commands that DropRequests kept from the server.
	DroppedRequests map[string]int
}

// NewProxy listens on a free port of 127.0.0.1 and forwards every client
// connection to target, a redis-server address. The proxy is closed in
// tb.Cleanup; register it after the server it fronts so it closes first.
func NewProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		tb.Fatalf("redistest: proxy listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		Addr:   ln.Addr().String(),
		target: target,
		ln:     ln,
		cancel: cancel,
		conns:  map[*conn]struct{}{},
		stats: Stats{
			SwallowedReplies: map[string]int{},
			DroppedRequests:  map[string]int{},
		},
	}
	p.wg.Add(1)
	go p.serve(ctx)
	tb.Cleanup(p.Close)
	return p
}

// Named returns a match function for DropReplies and DropRequests that
// matches commands by name, case-insensitively.
func Named(names ...string) func(cmd []string) bool {
	upper := make([]string, len(names))
	for i, n := range names {
		upper[i] = strings.ToUpper(n)
	}
	return func(cmd []string) bool {
		for _, n := range upper {
			if cmd[0] == n {
				return true
			}
		}
		return false
	}
}

// DropReplies swallows the replies of the next n commands that match: the
// command ran at Redis, but its client never hears of it. The proxy resets
// the client connection (RST) and closes its server connection, so replies
// pipelined after the swallowed one are lost too, and so are commands of the
// pipeline the server had not yet read. match may be called from several
// goroutines at once and must not block; the n replies are counted exactly
// under concurrency. Rules are tried in the order they were added.
func (p *Proxy) DropReplies(match func(cmd []string) bool, n int) {
	p.addRule(&p.replyRules, match, n)
}

// DropRequests keeps the next n commands that match from Redis: they never
// run. The proxy forwards the commands before a dropped one, then resets the
// client connection (RST) and closes its server connection. match is called
// as in DropReplies.
func (p *Proxy) DropRequests(match func(cmd []string) bool, n int) {
	p.addRule(&p.requestRules, match, n)
}

// SetReplyLoss swallows every reply with probability rate, as DropReplies
// does; rate 0 turns loss off. Only replies paired with a command that rules
// see can be lost, and only those a DropReplies rule did not already take;
// each of them draws once from a generator seeded with seed, so the losses
// are the same for the same seed and the same order of replies. It panics
// unless 0 <= rate <= 1.
func (p *Proxy) SetReplyLoss(rate float64, seed uint64) {
	if !(rate >= 0 && rate <= 1) {
		panic(fmt.Sprintf("redistest: SetReplyLoss rate %v not in [0, 1]", rate))
	}
	if rate == 0 {
		p.loss.Store(nil)
		return
	}
	p.loss.Store(&loss{rate: rate, rng: rand.New(rand.NewPCG(seed, seed))})
}

// Stats returns a copy of the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{
		Conns:            p.stats.Conns,
		SwallowedReplies: make(map[string]int, len(p.stats.SwallowedReplies)),
		DroppedRequests:  make(map[string]int, len(p.stats.DroppedRequests)),
	}
	for k, v := range p.stats.SwallowedReplies {
		s.SwallowedReplies[k] = v
	}
	for k, v := range p.stats.DroppedRequests {
		s.DroppedRequests[k] = v
	}
	return s
}

// Close stops accepting, closes every connection (both sides) and waits for
// all of the proxy's goroutines. Calling it again waits and does nothing
// else. Tests need not call it: NewProxy registers it with tb.Cleanup.
func (p *Proxy) Close() {
	p.mu.Lock()
	closed := p.closed
	p.closed = true
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	if !closed {
		p.cancel()
		_ = p.ln.Close()
		for _, c := range conns {
			c.close(false)
		}
	}
	p.wg.Wait()
}

// rule acts on the next left commands its match accepts.
type rule struct {
	match func(cmd []string) bool
	left  atomic.Int64 // matches still to act on
}

// take reports whether the rule acts on cmd, using up one of its matches.
func (r *rule) take(cmd []string) bool {
	if r.left.Load() <= 0 || !r.match(cmd) {
		return false
	}
	for {
		n := r.left.Load()
		if n <= 0 {
			return false // another connection used the last one up
		}
		if r.left.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// loss is the state of SetReplyLoss.
type loss struct {
	rate float64
	mu   sync.Mutex // guards rng
	rng  *rand.Rand
}

func (l *loss) hit() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64() < l.rate
}

func (p *Proxy) addRule(list *atomic.Pointer[[]*rule], match func(cmd []string) bool, n int) {
	if n <= 0 {
		return
	}
	r := &rule{match: match}
	r.left.Store(int64(n))
	p.mu.Lock()
	defer p.mu.Unlock()
	var rules []*rule
	if old := list.Load(); old != nil {
		for _, o := range *old {
			if o.left.Load() > 0 { // drop used-up rules as we go
				rules = append(rules, o)
			}
		}
	}
	rules = append(rules, r)
	list.Store(&rules)
}

// dropReply decides, once per reply, whether the reply to cmd is swallowed.
func (p *Proxy) dropReply(cmd []string) bool {
	drop := false
	if rules := p.replyRules.Load(); rules != nil {
		for _, r := range *rules {
			if r.take(cmd) {
				drop = true
				break
			}
		}
	}
	if !drop {
		if l := p.loss.Load(); l != nil && l.hit() {
			drop = true
		}
	}
	if drop {
		p.mu.Lock()
		p.stats.SwallowedReplies[cmd[0]]++
		p.mu.Unlock()
	}
	return drop
}

// dropRequest decides, once per command, whether cmd is kept from Redis.
func (p *Proxy) dropRequest(cmd []string) bool {
	rules := p.requestRules.Load()
	if rules == nil {
		return false
	}
	for _, r := range *rules {
		if r.take(cmd) {
			p.mu.Lock()
			p.stats.DroppedRequests[cmd[0]]++
			p.mu.Unlock()
			return true
		}
	}
	return false
}

// serve accepts client connections until Close.
func (p *Proxy) serve(ctx context.Context) {
	defer p.wg.Done()
	for {
		client, err := p.ln.AcceptTCP()
		if err != nil {
			if ctx.Err() != nil {
				return // closed
			}
			// Out of file descriptors and the like: back off and try again.
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		c := &conn{p: p, client: client}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.stats.Conns++
		// Added under mu, before Close can start waiting: Close sets closed
		// under mu first.
		p.wg.Add(1)
		p.mu.Unlock()
		go p.handle(ctx, c)
	}
}

// handle dials the server for c and runs its two pumps until either side
// ends or a fault resets it.
func (p *Proxy) handle(ctx context.Context, c *conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", p.target)
	if err != nil {
		// As the client sees it, the server refused it.
		c.close(true)
		return
	}
	if !c.setServer(server) {
		_ = server.Close() // closed while dialing
		return
	}
	replies := make(chan struct{})
	go func() {
		defer close(replies)
		c.pumpReplies(server)
	}()
	c.pumpRequests(server)
	c.close(false) // stops pumpReplies if it is still running
	<-replies
}

// conn is one client connection and its server connection.
type conn struct {
	p       *Proxy
	client  *net.TCPConn
	pending fifo // commands forwarded whose replies have not begun

	mu     sync.Mutex // guards server and closed
	server net.Conn   // nil until dialed
	closed bool
}

func (c *conn) setServer(s net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.server = s
	return true
}

// close closes both sides once. With reset the client gets a RST rather than
// a FIN, and bytes the proxy had not yet sent it are discarded.
func (c *conn) close(reset bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	server := c.server
	c.mu.Unlock()
	if reset {
		_ = c.client.SetLinger(0)
	}
	_ = c.client.Close()
	if server != nil {
		_ = server.Close()
	}
}

// pumpRequests forwards the client's commands to server, each after its FIFO
// entry is queued, until either side fails or a rule drops a command.
func (c *conn) pumpRequests(server net.Conn) {
	r := newReqParser()
	raw := false // pass bytes through from now on
	for {
		_, rerr := r.read(c.client)
		if !raw {
		parse:
			for {
				start := r.done
				kind, cmd, err := r.next()
				if err != nil {
					// Redis will answer with a protocol error and hang up;
					// the reply starts pass-through on the other side.
					c.pending.push(pending{raw: true})
					raw = true
					break
				}
				switch kind {
				case reqIncomplete:
					break parse
				case reqInline:
					c.pending.push(pending{})
				case reqCommand:
					if c.p.dropRequest(cmd) {
						// The commands before it go through; it and the
						// rest never reach Redis.
						_, _ = server.Write(r.buf[:start])
						c.close(true)
						return
					}
					e := pending{cmd: cmd, raw: endsPairing(cmd)}
					c.pending.push(e)
					if e.raw {
						raw = true
						break parse
					}
				}
			}
		}
		if raw {
			r.done = len(r.buf)
		}
		if r.done > 0 {
			if _, err := server.Write(r.buf[:r.done]); err != nil {
				return
			}
			r.compact()
		}
		if rerr != nil {
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

// pumpReplies forwards server's replies to the client until either side
// fails or a reply is swallowed.
func (c *conn) pumpReplies(server net.Conn) {
	buf := make([]byte, 32<<10)
	var sc scanner
	raw := false // pass bytes through from now on
	for {
		n, rerr := server.Read(buf)
		data := buf[:n]
		cut := -1
		if !raw {
			cut, raw = c.scanReplies(&sc, data)
		}
		if cut >= 0 {
			data = data[:cut]
		}
		if len(data) > 0 {
			if _, err := c.client.Write(data); err != nil {
				c.close(false)
				return
			}
		}
		if cut >= 0 {
			c.close(true)
			return
		}
		if rerr != nil {
			c.close(false)
			return
		}
	}
}

// scanReplies pairs each reply that begins in data with its command. It
// returns the offset of a reply to swallow (-1: none), or raw when the rest
// of the connection is to pass through.
func (c *conn) scanReplies(sc *scanner, data []byte) (cut int, raw bool) {
	for i := 0; i < len(data); {
		if sc.idle() {
			e, ok := c.pending.next(data[i] == '>')
			if ok && e.cmd != nil && c.p.dropReply(e.cmd) {
				return i, false
			}
			if ok && e.raw {
				return -1, true
			}
		}
		n, _, err := sc.scan(data[i:])
		if err != nil {
			return -1, true // not RESP as we know it: stop interpreting
		}
		i += n
	}
	return -1, false
}

// pending is a command awaiting its reply.
type pending struct {
	cmd []string // argv, cmd[0] upper case; nil for a command no rule sees
	raw bool     // the connection passes through from this command's reply on
}

// fifo is a connection's queue of pending commands. The request pump pushes
// an entry before it forwards the command, so a reply always finds its entry.
type fifo struct {
	mu   sync.Mutex // guards q and head
	q    []pending
	head int // q[head:] are queued
}

func (f *fifo) push(e pending) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.head > 1024 && f.head > len(f.q)/2 {
		n := copy(f.q, f.q[f.head:])
		clear(f.q[n:])
		f.q, f.head = f.q[:n], 0
	}
	f.q = append(f.q, e)
}

// next pops the oldest entry for a reply that begins now. A push frame is
// not a reply and pops nothing, unless the oldest entry ends pairing (a RESP3
// SUBSCRIBE is answered with push frames).
func (f *fifo) next(push bool) (pending, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.head == len(f.q) {
		return pending{}, false
	}
	e := f.q[f.head]
	if push && !e.raw {
		return pending{}, false
	}
	f.q[f.head] = pending{}
	f.head++
	if f.head == len(f.q) {
		f.q, f.head = f.q[:0], 0
	}
	return e, true
}

// Limits on what the parsers accept; past them the stream is passed through.
const (
	maxHeader = 32       // a length line: type byte, digits, CRLF
	maxInline = 64 << 10 // as Redis's PROTO_INLINE_MAX_SIZE
	maxArgs   = 1 << 20  // as Redis's multibulk limit
	minRead   = 16 << 10
)

var errProtocol = errors.New("redistest: unexpected RESP")

type reqKind int

const (
	reqIncomplete reqKind = iota
	reqNoReply            // an empty inline line or an array of length <= 0: Redis skips it
	reqInline             // an inline command: answered, but no rule sees it
	reqCommand            // an array of bulk strings
)

// reqParser splits the client's stream into commands. It keeps its progress
// through a command that arrives over many reads, so no byte is scanned
// twice, but holds the command until it is whole: rules need all of argv.
type reqParser struct {
	buf  []byte // bytes read and not yet forwarded
	done int    // buf[:done] are whole commands
	pos  int    // progress through the command at buf[done:]
	argc int    // its array length; -1 until read
	bulk int    // length of the argument being read; -1 until read
	args []string
}

func newReqParser() *reqParser {
	return &reqParser{buf: make([]byte, 0, minRead), argc: -1, bulk: -1}
}

// read appends what the next Read of rd returns.
func (r *reqParser) read(rd net.Conn) (int, error) {
	if cap(r.buf)-len(r.buf) < minRead {
		nb := make([]byte, len(r.buf), 2*cap(r.buf)+minRead)
		copy(nb, r.buf)
		r.buf = nb
	}
	n, err := rd.Read(r.buf[len(r.buf):cap(r.buf)])
	r.buf = r.buf[:len(r.buf)+n]
	return n, err
}

// compact drops the forwarded bytes buf[:done].
func (r *reqParser) compact() {
	n := copy(r.buf, r.buf[r.done:])
	r.buf, r.done = r.buf[:n], 0
	if n == 0 && cap(r.buf) > 1<<20 {
		r.buf = make([]byte, 0, minRead) // let a huge command's buffer go
	}
}

// next parses the command at buf[done:] and, when it is whole, moves done
// past it.
func (r *reqParser) next() (reqKind, []string, error) {
	b := r.buf[r.done:]
	if len(b) == 0 {
		return reqIncomplete, nil, nil
	}
	if b[0] != '*' {
		i := bytes.IndexByte(b[r.pos:], '\n')
		if i < 0 {
			r.pos = len(b)
			if len(b) > maxInline {
				return reqIncomplete, nil, errProtocol
			}
			return reqIncomplete, nil, nil
		}
		line := b[:r.pos+i+1]
		r.finish(len(line))
		if len(bytes.TrimSpace(line)) == 0 {
			return reqNoReply, nil, nil
		}
		return reqInline, nil, nil
	}
	if r.argc < 0 {
		v, n, err := parseHeader(b)
		if err != nil || n == 0 {
			return reqIncomplete, nil, err
		}
		if v > maxArgs {
			return reqIncomplete, nil, errProtocol
		}
		if v <= 0 {
			r.finish(n)
			return reqNoReply, nil, nil
		}
		r.argc, r.pos = v, n
		r.args = make([]string, 0, min(v, 16))
	}
	for len(r.args) < r.argc {
		if r.bulk < 0 {
			rest := b[r.pos:]
			if len(rest) == 0 {
				return reqIncomplete, nil, nil
			}
			if rest[0] != '$' {
				return reqIncomplete, nil, errProtocol
			}
			v, n, err := parseHeader(rest)
			if err != nil || n == 0 {
				return reqIncomplete, nil, err
			}
			if v < 0 {
				return reqIncomplete, nil, errProtocol
			}
			r.bulk = v
			r.pos += n
		}
		if len(b)-r.pos < r.bulk+2 {
			return reqIncomplete, nil, nil
		}
		if b[r.pos+r.bulk] != '\r' || b[r.pos+r.bulk+1] != '\n' {
			return reqIncomplete, nil, errProtocol
		}
		r.args = append(r.args, string(b[r.pos:r.pos+r.bulk]))
		r.pos += r.bulk + 2
		r.bulk = -1
	}
	cmd := r.args
	cmd[0] = strings.ToUpper(cmd[0])
	r.args = nil
	r.finish(r.pos)
	return reqCommand, cmd, nil
}

func (r *reqParser) finish(n int) {
	r.done += n
	r.pos, r.argc, r.bulk = 0, -1, -1
}

// parseHeader parses a length line such as "*3\r\n" or "$-1\r\n" at the
// start of b. It returns the length and the line's size, or n == 0 when the
// line is not all there yet.
func parseHeader(b []byte) (v, n int, err error) {
	i := bytes.IndexByte(b[:min(len(b), maxHeader)], '\n')
	if i < 0 {
		if len(b) >= maxHeader {
			return 0, 0, errProtocol
		}
		return 0, 0, nil
	}
	v, err = parseLen(b[1 : i+1])
	if err != nil {
		return 0, 0, err
	}
	return v, i + 1, nil
}

// parseLen parses the digits of a length line, which end in "\r\n" or
// (from the scanner, which stops at '\n') in "\r".
func parseLen(b []byte) (int, error) {
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) < 2 || b[len(b)-1] != '\r' {
		return 0, errProtocol
	}
	// At most 18 characters before the '\r': no overflow, and len+2 stays
	// positive.
	if len(b) > 19 {
		return 0, errProtocol
	}
	v, err := strconv.Atoi(string(b[:len(b)-1]))
	if err != nil {
		return 0, errProtocol
	}
	return v, nil
}

// scanner finds where replies end in the server's stream without holding
// them: it keeps only the nesting of open aggregates and its place in the
// current element, so the proxy forwards bytes as they arrive. It knows RESP2
// and RESP3 (+ - : $ * _ , # ! = ( % ~ > |) with null bulks and arrays, but
// not RESP3 streamed strings or aggregates (Redis does not send them).
type scanner struct {
	state     scanState
	typ       byte // type byte of the current element
	hdr       [maxHeader]byte
	hdrLen    int        // bytes of a length line in hdr
	skip      int        // bytes of a bulk payload and its CRLF still to come
	stack     []aggState // open aggregates, innermost last
	afterAttr bool       // a top-level attribute ended; its reply has not
}

type scanState int

const (
	scanType scanState = iota // expecting a type byte
	scanLine                  // skipping a simple line to its '\n'
	scanLen                   // reading a length line
	scanBulk                  // skipping a bulk payload
)

type aggState struct {
	left int  // elements still to come
	attr bool // an attribute: when it ends, its parent still awaits the element it annotates
}

// idle reports whether the scanner is between replies.
func (s *scanner) idle() bool {
	return s.state == scanType && len(s.stack) == 0 && !s.afterAttr
}

// scan consumes bytes of b up to the end of the current reply or of b,
// whichever comes first. It returns how many bytes it consumed and whether a
// reply ended there.
func (s *scanner) scan(b []byte) (n int, end bool, err error) {
	for n < len(b) {
		switch s.state {
		case scanType:
			s.typ = b[n]
			n++
			switch s.typ {
			case '+', '-', ':', '_', ',', '#', '(':
				s.state = scanLine
			case '$', '!', '=', '*', '~', '>', '%', '|':
				s.state, s.hdrLen = scanLen, 0
			default:
				return n, false, errProtocol
			}
		case scanLine:
			i := bytes.IndexByte(b[n:], '\n')
			if i < 0 {
				return len(b), false, nil
			}
			n += i + 1
			if s.elementEnd(false) {
				return n, true, nil
			}
		case scanLen:
			c := b[n]
			n++
			if c != '\n' {
				if s.hdrLen == len(s.hdr) {
					return n, false, errProtocol
				}
				s.hdr[s.hdrLen] = c
				s.hdrLen++
				continue
			}
			v, err := parseLen(s.hdr[:s.hdrLen])
			if err != nil {
				return n, false, err
			}
			if s.open(v) {
				return n, true, nil
			}
		case scanBulk:
			k := min(s.skip, len(b)-n)
			n += k
			s.skip -= k
			if s.skip == 0 && s.elementEnd(false) {
				return n, true, nil
			}
		}
	}
	return n, false, nil
}

// open acts on a length line of value v and reports whether a reply ended.
func (s *scanner) open(v int) bool {
	switch s.typ {
	case '$', '!', '=':
		if v < 0 {
			return s.elementEnd(false) // null bulk
		}
		s.state, s.skip = scanBulk, v+2
		return false
	case '%':
		v *= 2
	case '|':
		if v <= 0 {
			return s.elementEnd(true)
		}
		s.stack = append(s.stack, aggState{left: 2 * v, attr: true})
		s.state = scanType
		return false
	}
	if v <= 0 {
		return s.elementEnd(false) // empty or null aggregate
	}
	s.stack = append(s.stack, aggState{left: v})
	s.state = scanType
	return false
}

// elementEnd records that an element (an attribute, if attr) ended and
// reports whether that ended a reply.
func (s *scanner) elementEnd(attr bool) bool {
	s.state = scanType
	for {
		if attr {
			// An attribute annotates the element after it and does not
			// count as one of its parent's.
			if len(s.stack) == 0 {
				s.afterAttr = true
			}
			return false
		}
		if len(s.stack) == 0 {
			s.afterAttr = false
			return true
		}
		top := &s.stack[len(s.stack)-1]
		top.left--
		if top.left > 0 {
			return false
		}
		attr = top.attr
		s.stack = s.stack[:len(s.stack)-1]
	}
}
