package redisproxy

// This file is one proxied connection: commands up, replies down, paired,
// and the faults applied to them.

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

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

	mu          sync.Mutex  // guards pending, sent and passthrough
	pending     [][]string  // commands sent, replies not yet seen
	sent        []time.Time // when each pending command was sent to Redis
	passthrough bool        // pub/sub or MONITOR: no pairing any more
	once        sync.Once   // guards the reset
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
			c.sent = append(c.sent, time.Now())
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
		var sent time.Time
		if len(c.pending) > 0 {
			cmd, c.pending = c.pending[0], c.pending[1:]
			sent, c.sent = c.sent[0], c.sent[1:]
		}
		c.mu.Unlock()
		swallow := false
		var fire *cut
		var hold time.Duration
		if cmd != nil {
			p := c.p
			p.mu.Lock()
			if p.delay > 0 && p.slow != nil && p.slow(cmd) {
				hold = time.Until(sent.Add(p.delay))
			}
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
		time.Sleep(hold)
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
