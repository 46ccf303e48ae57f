package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"
)

// maxBody is how much of a response body conn keeps to find its status; the rest
// is read and thrown away. docs/api.md's answers are a few hundred bytes.
const maxBody = 16 << 10

// conn is one keep-alive connection to the target and the goroutine that owns it:
// it takes arrivals off the driver's queue one at a time, sends each as POST
// /grab, reads the answer and records it. It (re)dials on demand: a request that
// fails for want of a connection counts as a transport error, and the next one
// dials again. A request whose kept-alive connection turns out closed by the
// server is sent once more on a new one.
type conn struct {
	d    *driver
	nc   net.Conn // nil when not connected
	br   *bufio.Reader
	head string  // request line and headers, but the token and Content-Length
	sign *signer // nil: no user token
	req  []byte  // the request being sent
	body bytes.Buffer
}

func newConn(d *driver) *conn {
	path := strings.TrimSuffix(d.cfg.base.Path, "/") + "/grab"
	return &conn{
		d: d,
		head: "POST " + path + " HTTP/1.1\r\nHost: " + d.cfg.base.Host +
			"\r\nUser-Agent: rainload\r\nContent-Type: application/json\r\n",
		sign: d.cfg.signer.forConn(),
	}
}

// serve runs requests until the driver's queue is closed and empty, then closes
// the connection.
func (c *conn) serve() {
	defer c.close()
	for a := range c.d.queue {
		st, code := c.do(a)
		now := time.Since(c.d.start)
		c.d.finish(st, code, now-a.due, now)
	}
}

// do sends a and reads its answer.
func (c *conn) do(a arrival) (status, int) {
	now := time.Since(c.d.start)
	deadline, ok := c.deadline(a, now)
	if !ok {
		return transport, 0 // waited out its timeout for a connection
	}
	abs := c.d.start.Add(deadline)
	for retried := false; ; retried = true {
		reused := c.nc != nil
		code, err := c.roundTrip(abs, a.user)
		if err == nil {
			return classify(code, c.body.Bytes()), code
		}
		c.close()
		// A kept-alive connection that the server closed while it was idle
		// fails before any answer: send once more on a new one. net/http does
		// so only for requests it may replay; a grab may be replayed (docs/api.md:
		// a retry never yields a second grant).
		if !reused || retried || !errors.Is(err, errNoAnswer) {
			return transport, 0
		}
	}
}

// errNoAnswer is returned by roundTrip when the connection ended before the
// first byte of an answer.
var errNoAnswer = errors.New("connection closed before an answer")

// roundTrip sends the request for user, dialing first if not connected, and
// reads the answer into c.body; everything must be done by deadline. It leaves
// the connection closed when the answer says so; on an error the caller closes
// it.
func (c *conn) roundTrip(deadline time.Time, user int64) (int, error) {
	if c.nc == nil {
		nc, err := (&net.Dialer{Deadline: deadline}).Dial("tcp", c.d.cfg.addr)
		if err != nil {
			return 0, err
		}
		c.nc = nc
		if c.br == nil {
			c.br = bufio.NewReaderSize(nc, 4<<10)
		} else {
			c.br.Reset(nc)
		}
	}
	if err := c.nc.SetDeadline(deadline); err != nil {
		return 0, err
	}
	c.req = c.appendRequest(c.req[:0], user)
	if _, err := c.nc.Write(c.req); err != nil {
		if !isTimeout(err) {
			err = errors.Join(errNoAnswer, err)
		}
		return 0, err
	}
	code, keep, err := c.readResponse()
	if err != nil {
		return 0, err
	}
	if !keep {
		c.close()
	}
	return code, nil
}

// errMalformed is returned by readResponse for an answer that is not HTTP/1.x.
var errMalformed = errors.New("malformed HTTP response")

// readResponse reads one HTTP/1.x response into c.body (its first maxBody bytes)
// and returns its status code and whether the connection may carry another
// request. It parses only what a client of rain needs (the status line,
// Content-Length, Transfer-Encoding, Connection): net/http.ReadResponse builds a
// header map per answer, which cost the driver a quarter of its CPU.
func (c *conn) readResponse() (code int, keep bool, err error) {
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		if len(line) == 0 && !isTimeout(err) {
			err = errors.Join(errNoAnswer, err)
		}
		return 0, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, errMalformed
	}
	code, err = strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 {
		return 0, false, errMalformed
	}
	keep = line[7] == '1' // HTTP/1.1 keeps the connection by default, 1.0 does not
	length, chunked := int64(-1), false
	for {
		h, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		h = bytes.TrimRight(h, "\r\n")
		if len(h) == 0 {
			break
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if !ok {
			return 0, false, errMalformed
		}
		value = bytes.TrimSpace(value)
		switch {
		case asciiEqualFold(name, "content-length"):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil || length < 0 {
				return 0, false, errMalformed
			}
		case asciiEqualFold(name, "transfer-encoding"):
			chunked = asciiEqualFold(value, "chunked")
		case asciiEqualFold(name, "connection"):
			if asciiEqualFold(value, "close") {
				keep = false
			} else if asciiEqualFold(value, "keep-alive") {
				keep = true
			}
		}
	}
	if code < 200 {
		return c.readResponse() // 1xx: the real answer follows
	}
	var body io.Reader
	switch {
	case code == http.StatusNoContent || code == http.StatusNotModified:
		body = eof{}
	case chunked:
		body = httputil.NewChunkedReader(c.br)
	case length >= 0:
		body = io.LimitReader(c.br, length)
	default: // the body runs to the end of the connection
		body, keep = c.br, false
	}
	c.body.Reset()
	if _, err := c.body.ReadFrom(io.LimitReader(body, maxBody)); err != nil {
		return 0, false, err
	}
	if _, err := io.Copy(io.Discard, body); err != nil {
		return 0, false, err
	}
	if chunked {
		// httputil's reader stops at the last chunk; the trailer (usually
		// just the empty line) follows.
		for {
			t, err := c.br.ReadSlice('\n')
			if err != nil {
				return 0, false, err
			}
			if len(bytes.TrimRight(t, "\r\n")) == 0 {
				break
			}
		}
	}
	return code, keep, nil
}

// isTimeout reports whether err is a deadline passing.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// eof is an empty body.
type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }

// asciiEqualFold reports whether b equals the lower-case ASCII s, ignoring case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}

// deadline returns when the request for a must be answered, as time since start:
// cfg.timeout after a was due, so that its wait for a connection counts, as it
// does in its latency. Every arrival is due before the schedule stops, so no
// request outlives the stop by more than cfg.timeout. It reports false when that
// time is not after now.
func (c *conn) deadline(a arrival, now time.Duration) (time.Duration, bool) {
	dl := a.due + c.d.cfg.timeout
	return dl, dl > now
}

// appendRequest appends the HTTP request for user to b.
func (c *conn) appendRequest(b []byte, user int64) []byte {
	cfg := c.d.cfg
	// {"pool_id":"P","user_id":"PREFIXn"}: ids were checked to need no escaping.
	n := len(`{"pool_id":"","user_id":""}`) + len(cfg.pool) + len(cfg.userPrefix) + digits(user)
	b = append(b, c.head...)
	if c.sign != nil {
		b = append(b, "Authorization: Bearer "...)
		b = c.sign.appendToken(b, cfg.userPrefix, user)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Content-Length: "...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, `{"pool_id":"`...)
	b = append(b, cfg.pool...)
	b = append(b, `","user_id":"`...)
	b = append(b, cfg.userPrefix...)
	b = strconv.AppendInt(b, user, 10)
	b = append(b, `"}`...)
	return b
}

func (c *conn) close() {
	if c.nc != nil {
		c.nc.Close()
		c.nc = nil
	}
}

// digits returns the length of the decimal form of n >= 0.
func digits(n int64) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}

// classify maps an HTTP answer to its status: 503 is overloaded and other 5xx
// are errors whatever the body says; otherwise the body's "status" decides, and
// an answer without a status of docs/api.md is an error.
func classify(code int, body []byte) status {
	switch {
	case code == http.StatusServiceUnavailable:
		return overloaded
	case code >= 500:
		return errStatus
	}
	switch string(statusField(body)) {
	case "granted":
		return granted
	case "already_granted":
		return alreadyGranted
	case "sold_out":
		return soldOut
	case "not_found":
		return notFound
	case "not_started":
		return notStarted
	case "ended":
		return ended
	case "overloaded":
		return overloaded
	case "invalid":
		return invalid
	case "unauthorized":
		return unauthorized
	case "rate_limited":
		return rateLimited
	}
	return errStatus
}

// statusField returns the string value of the top-level "status" key of a JSON
// object, or nil. It is a scan, not a parser: docs/api.md's bodies are flat objects
// whose other values cannot contain `"status"` (ids are checked not to).
func statusField(body []byte) []byte {
	i := bytes.Index(body, []byte(`"status"`))
	if i < 0 {
		return nil
	}
	rest := bytes.TrimLeft(body[i+len(`"status"`):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return nil
	}
	rest = bytes.TrimLeft(rest[1:], " \t\r\n")
	if len(rest) == 0 || rest[0] != '"' {
		return nil
	}
	rest = rest[1:]
	end := bytes.IndexByte(rest, '"')
	if end < 0 {
		return nil
	}
	return rest[:end]
}
