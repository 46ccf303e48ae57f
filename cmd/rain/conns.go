package main

// This file keeps the number of open client connections under a cap, so
// that a flood of idle keep-alive sockets cannot use up the process's file
// descriptors and starve the grabs (and the readiness probe) of new ones.

import (
	"net"
	"net/http"
	"sync"
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
