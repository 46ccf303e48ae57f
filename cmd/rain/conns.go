package main

// This file keeps the number of open client connections under a cap, so
// that a flood of idle keep-alive sockets cannot use up the process's file
// descriptors and starve the grabs (and the readiness probe) of new ones.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// connGuard is an http.Server ConnState hook. When a new connection takes
// the count over max, it closes the connection idle the longest; when none
// is idle, it closes the new one. Active requests are never cut.
type connGuard struct {
	max int

	mu   sync.Mutex             // guards the fields below
	open int                    // connections open
	idle map[net.Conn]time.Time // idle connections, since when
	shed int64                  // connections closed to stay under max
}

func newConnGuard(max int) *connGuard {
	return &connGuard{max: max, idle: map[net.Conn]time.Time{}}
}

// state is the ConnState hook.
func (g *connGuard) state(c net.Conn, st http.ConnState) {
	var victim net.Conn
	g.mu.Lock()
	switch st {
	case http.StateNew:
		g.open++
		if g.open > g.max {
			victim = c
			var since time.Time
			for ic, t := range g.idle {
				if victim == c || t.Before(since) {
					victim, since = ic, t
				}
			}
			delete(g.idle, victim)
			g.shed++
		}
	case http.StateIdle:
		g.idle[c] = time.Now()
	case http.StateActive:
		delete(g.idle, c)
	case http.StateClosed, http.StateHijacked:
		delete(g.idle, c)
		g.open--
	}
	g.mu.Unlock()
	if victim != nil {
		_ = victim.Close() // net/http sees it closed and reports StateClosed
	}
}

// drain closes every idle connection once it has been idle for grace, and
// returns when no connection is open or at deadline (it reports whether
// none is). It runs after the listener has closed: a connection that
// sends a request meanwhile is answered, and the answer closes it (the
// API's Drain); one idle for grace is closed while no request is on its
// way, so closing it drops nothing (a connection closed the moment it
// turned idle would race the client's next request on the wire).
func (g *connGuard) drain(deadline time.Time, grace time.Duration) bool {
	for {
		now := time.Now()
		var victims []net.Conn
		g.mu.Lock()
		for c, since := range g.idle {
			if now.Sub(since) >= grace {
				victims = append(victims, c)
				delete(g.idle, c)
			}
		}
		open := g.open - len(victims)
		g.mu.Unlock()
		for _, c := range victims {
			_ = c.Close()
		}
		if open <= 0 {
			return true
		}
		if now.After(deadline) {
			return false
		}
		time.Sleep(drainPoll)
	}
}

// drainPoll is how often drain looks at the connections again.
const drainPoll = 10 * time.Millisecond

// stats returns the connections open and those closed to stay under max.
func (g *connGuard) stats() (open int, shed int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.shed
}

// defaultMaxConns leaves room under the file descriptor limit for the shard
// connections, the listeners and the files the process opens.
func defaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 512 {
		return 256
	}
	return int(min(lim.Cur, 1<<20)) - 256
}

// stoppable is the API's listener: Stop ends it without resetting the
// connections that are waiting in its backlog (their handshake done, not
// yet accepted; closing a listening socket resets them, and their clients
// would see a request cut off). Stop makes Accept take what is waiting and
// then report net.ErrClosed, and only then closes the socket: what is lost
// is a handshake completed in the microseconds between the last accept
// and the close.
type stoppable struct {
	*net.TCPListener
	stopping atomic.Bool
}

// Stop ends the listener; Serve returns net.ErrClosed once the backlog is
// taken.
func (l *stoppable) Stop() {
	l.stopping.Store(true)
	_ = l.SetDeadline(time.Now()) // an accept that would wait times out
}

func (l *stoppable) Accept() (net.Conn, error) {
	c, err := l.TCPListener.Accept()
	if err != nil && l.stopping.Load() {
		// An accept woken by Stop's deadline reports it without asking
		// the socket again; this one asks (it accepts before it waits), so
		// only an empty backlog ends the listener.
		if c, err = l.TCPListener.Accept(); err == nil {
			return c, nil
		}
		_ = l.TCPListener.Close()
		return nil, net.ErrClosed
	}
	return c, err
}

// jsonErrors wraps a listener so that the answers net/http writes itself,
// before any handler runs (431 for headers over MaxHeaderBytes, 400 for a
// request it cannot parse, 501 for an unknown transfer encoding), are JSON
// like every other answer of rain's. net/http writes each of those in one
// Write, in one fixed shape (status line, plain-text headers with
// "Connection: close", the status as body); only writes of that exact
// shape are rewritten.
type jsonErrors struct{ net.Listener }

func (l jsonErrors) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return jsonErrorConn{c}, nil
}

type jsonErrorConn struct{ net.Conn }

// CloseWrite half-closes the connection: net/http does before it closes a
// connection whose request it refused, so that the client sees the answer
// end rather than a reset (the wrapper must not hide it).
func (c jsonErrorConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// serverErrorHeaders are the headers of net/http's own error answers.
const serverErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c jsonErrorConn) Write(p []byte) (int, error) {
	if out, ok := jsonServerError(p); ok {
		if _, err := c.Conn.Write(out); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// jsonServerError rewrites one of net/http's own error answers as JSON.
func jsonServerError(p []byte) ([]byte, bool) {
	const proto = "HTTP/1.1 "
	if len(p) > 1024 || !bytes.HasPrefix(p, []byte(proto)) {
		return nil, false
	}
	line, body, ok := bytes.Cut(p[len(proto):], []byte(serverErrorHeaders))
	if !ok || len(line) < 4 || line[3] != ' ' {
		return nil, false
	}
	code, err := strconv.Atoi(string(line[:3]))
	if err != nil || code < 400 || code > 599 {
		return nil, false
	}
	text := strings.TrimPrefix(string(body), string(line[:4]))
	if text == "" {
		text = string(line[4:])
	}
	status := "invalid"
	if code >= 500 {
		status = "error"
	}
	js, _ := json.Marshal(map[string]string{"status": status, "error": strings.ToLower(text)})
	js = append(js, '\n')
	out := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		code, http.StatusText(code), len(js))
	return append(out, js...), true
}

// openNow is the number of connections open.
func (g *connGuard) openNow() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}
