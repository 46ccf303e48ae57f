package api

// This file keeps the number of open client connections under a cap, so
// that a flood of idle keep-alive sockets cannot use up the process's file
// descriptors and starve the grabs (and the readiness probe) of new ones.

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// connGuard is the listener's ConnState hook. When a new connection takes
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
func (g *connGuard) state(c net.Conn, st fasthttp.ConnState) {
	var victim net.Conn
	g.mu.Lock()
	switch st {
	case fasthttp.StateNew:
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
	case fasthttp.StateIdle:
		g.idle[c] = time.Now()
	case fasthttp.StateActive:
		delete(g.idle, c)
	case fasthttp.StateClosed, fasthttp.StateHijacked:
		delete(g.idle, c)
		g.open--
	}
	g.mu.Unlock()
	if victim != nil {
		_ = victim.Close() // the server sees it closed and reports StateClosed
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

// DefaultMaxConns is Config.MaxConns's default: it leaves room under the file descriptor limit for the shard
// connections, the listeners and the files the process opens.
func DefaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 512 {
		return 256
	}
	return int(min(lim.Cur, 1<<20)) - 256
}

// stoppable is the listener's socket: Stop ends it without resetting the
// connections that are waiting in its backlog (their handshake done, not
// yet accepted; closing a listening socket resets them, and their clients
// would see a request cut off). Stop makes Accept take what is waiting and
// then report net.ErrClosed, and only then closes the socket: what is lost
// is a handshake completed in the microseconds between the last accept
// and the close.
type stoppable struct {
	*net.TCPListener
	stopping atomic.Bool
	log      *slog.Logger // told of accepts retried (nil: not told)
}

// Stop ends the listener; Accept returns net.ErrClosed once the backlog
// is taken.
func (l *stoppable) Stop() {
	l.stopping.Store(true)
	_ = l.SetDeadline(time.Now()) // an accept that would wait times out
}

// backlogWait is how long an accept after Stop waits for a connection
// the kernel has completed but not yet handed over (an accept woken by a
// deadline already past reports it without asking the socket at all).
const backlogWait = 5 * time.Millisecond

func (l *stoppable) Accept() (net.Conn, error) {
	for retry := time.Duration(0); ; {
		c, err := l.TCPListener.Accept()
		switch {
		case err == nil:
			return c, nil
		case l.stopping.Load():
			// Take the backlog: ask the socket with a deadline just ahead,
			// so that only an empty backlog ends the listener.
			_ = l.SetDeadline(time.Now().Add(backlogWait))
			if c, err = l.TCPListener.Accept(); err == nil {
				return c, nil
			}
			_ = l.TCPListener.Close()
			return nil, net.ErrClosed
		case !temporary(err):
			return nil, err
		}
		// Out of file descriptors (or buffers) for a moment: wait and
		// accept again, as net/http does, rather than end the listener
		// (and rain serve with it) in the middle of a rain.
		retry = min(max(2*retry, 5*time.Millisecond), time.Second)
		if l.log != nil {
			l.log.Warn("accept failed; trying again", "err", err, "in", retry)
		}
		time.Sleep(retry)
	}
}

// temporary reports whether an accept error passes by itself: the process
// or the system out of file descriptors or memory for a moment, or a
// connection reset before it was accepted.
func temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Close closes the socket; after Stop, it has closed already (the
// server closes its listeners again at shutdown: nothing to report).
func (l *stoppable) Close() error {
	if err := l.TCPListener.Close(); err != nil && !l.stopping.Load() {
		return err
	}
	return nil
}

// openNow is the number of connections open.
func (g *connGuard) openNow() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}
