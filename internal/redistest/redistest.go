// Package redistest starts real redis-server processes for tests.
//
// Every server gets a free port on 127.0.0.1 and its own temporary directory, is
// polled with PING until it answers, and is killed and waited for in t.Cleanup.
// Fault tests can Kill a server with SIGKILL and Restart it on the same port and
// directory, so with AOF on it comes back with what it had fsynced; Pause and
// Resume freeze and thaw it (SIGSTOP, SIGCONT); SnapshotAOF and RestoreAOF
// roll its AOF back to an earlier copy, a host that lost its AOF tail. To
// lose replies or requests on the wire, put a redisproxy.Proxy in front.
//
// rain's tests never mock Redis. When redis-server is not on PATH the test fails
// (it does not skip) with a message that says how to get it.
package redistest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Missing is the message a test fails with when redis-server cannot be found.
const Missing = "redis-server not found on PATH: run scripts/test.sh, which installs it, " +
	"or install it yourself (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis)"

// startTimeout bounds how long a server may take to answer PING after start
// (loading a large AOF counts).
const startTimeout = 20 * time.Second

// Options configure a server. The zero value is a server without persistence.
type Options struct {
	// AOF turns on the append-only file. Off by default.
	AOF bool
	// Fsync is appendfsync when AOF is on: "always", "everysec" (default) or "no".
	Fsync string
	// ReplicaOf, when set, is the address of the primary this server
	// replicates.
	ReplicaOf string
	// Args are more redis-server arguments ("--name", "value", ...).
	Args []string
	// Cluster runs the server as a Redis Cluster node (cluster-enabled,
	// its cluster bus on a port of its own); StartCluster makes nodes into
	// a cluster. NodeTimeout is its cluster-node-timeout (default 2s).
	Cluster     bool
	NodeTimeout time.Duration

	// sentinel: run redis-server --sentinel on conf (StartSentinel).
	sentinel bool
}

// Server is one redis-server process owned by a test.
type Server struct {
	// Addr is host:port, stable across Restart.
	Addr string
	// Dir is the server's working directory (its AOF lives there), stable across Restart.
	Dir string

	tb      testing.TB
	bin     string
	opts    Options
	port    int
	busPort int // the cluster bus's, with Options.Cluster

	mu   sync.Mutex // guards cmd and done
	cmd  *exec.Cmd  // nil while the server is down
	done chan error // receives cmd.Wait's result once
}

// Start starts one server and registers its cleanup with tb.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(Missing)
	}
	if opts.Fsync == "" {
		opts.Fsync = "everysec"
	}
	s := &Server{tb: tb, bin: bin, opts: opts, Dir: tb.TempDir()}
	tb.Cleanup(s.Kill)
	// A free port found by listening on :0 can be taken by someone else before
	// redis-server binds it; try a few ports before giving up.
	var lastErr error
	for range 5 {
		s.port, err = freePort()
		if err != nil {
			tb.Fatalf("redistest: free port: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if opts.Cluster {
			if s.busPort, err = freePort(); err != nil {
				tb.Fatalf("redistest: free port: %v", err)
			}
		}
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	tb.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

// StartN starts n servers with the same options.
func StartN(tb testing.TB, n int, opts Options) []*Server {
	tb.Helper()
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = Start(tb, opts)
	}
	return servers
}

// Addrs returns the addresses of servers, in order.
func Addrs(servers []*Server) []string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	return addrs
}

func (s *Server) args() []string {
	if s.opts.sentinel {
		return []string{filepath.Join(s.Dir, "sentinel.conf"), "--sentinel",
			"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--daemonize", "no",
			"--protected-mode", "no", "--logfile", "redis.log", "--dir", s.Dir}
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--logfile", "redis.log",
	}
	if s.opts.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", s.opts.Fsync)
	} else {
		args = append(args, "--appendonly", "no")
	}
	if s.opts.ReplicaOf != "" {
		host, port, _ := net.SplitHostPort(s.opts.ReplicaOf)
		args = append(args, "--replicaof", host, port)
	}
	if s.opts.Cluster {
		timeout := s.opts.NodeTimeout
		if timeout <= 0 {
			timeout = 2 * time.Second
		}
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.busPort), "--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			// A replica syncs at once (Redis waits 5 s for more replicas
			// by default): one that never synced cannot take over.
			"--repl-diskless-sync-delay", "0")
	}
	return append(args, s.opts.Args...)
}

func (s *Server) start() error {
	// The port was free when chosen, and another test's server may have
	// taken it since: a PING answered there proves nothing. Only this
	// process's own log line that it accepts connections does (its log
	// keeps the lines of earlier starts: count them).
	before := s.readyLines()
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.Dir
	// The kernel kills the server if the test binary dies, so no redis-server
	// outlives a crashed or timed-out test run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			s.mu.Lock()
			s.cmd, s.done = nil, nil
			s.mu.Unlock()
			return fmt.Errorf("redis-server on %s exited at start (%v): %s", s.Addr, err, s.logTail())
		default:
		}
		if s.readyLines() > before && ping(s.Addr) == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("redis-server on %s did not answer PING within %v: %s", s.Addr, startTimeout, s.logTail())
}

// Kill sends SIGKILL and waits for the process to exit: a crash, as far as
// Redis is concerned (nothing beyond what was fsynced survives). Killing a
// server that is down does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// PID returns the process id of the running server, or 0 while it is down.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Pause freezes the server with SIGSTOP: a stalled shard. It keeps its data
// and its sockets, and the kernel still completes new TCP handshakes, so
// clients connect and send, then wait for replies until their timeouts. Resume
// wakes it, and it answers what was queued. Kill works on a paused server
// (SIGKILL ends a stopped process), so cleanup never hangs on one. Pausing a
// server that is down fails the test.
func (s *Server) Pause() {
	s.tb.Helper()
	s.signal(syscall.SIGSTOP)
}

// Resume continues a server stopped by Pause with SIGCONT; resuming one that
// is not paused does nothing. Resuming a server that is down fails the test.
func (s *Server) Resume() {
	s.tb.Helper()
	s.signal(syscall.SIGCONT)
}

func (s *Server) signal(sig syscall.Signal) {
	s.tb.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.tb.Fatalf("redistest: %v to %s while it is down", sig, s.Addr)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		s.tb.Fatalf("redistest: %v to %s: %v", sig, s.Addr, err)
	}
}

// aofDir is where Redis 7 keeps the AOF (appenddirname, inside dir): a
// manifest and the base and incr files it names.
// Restart starts the server again on the same port and directory after Kill.
func (s *Server) Restart() {
	s.tb.Helper()
	s.mu.Lock()
	up := s.cmd != nil
	s.mu.Unlock()
	if up {
		s.tb.Fatalf("redistest: Restart of %s while it is running; Kill it first", s.Addr)
	}
	// The port was ours a moment ago; a fresh listener from another process
	// could take it, but nothing else on a test machine binds random high ports.
	var err error
	for range 50 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.tb.Fatalf("redistest: restart: %v", err)
}

// readyLines counts the times this server's log says it is ready to
// accept connections (a sentinel: that it runs, once it listens): each
// start adds one.
func (s *Server) readyLines() int {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return bytes.Count(b, []byte("Ready to accept connections")) + bytes.Count(b, []byte("Sentinel ID is"))
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitAOFIdle polls INFO persistence until no AOF rewrite is in progress or
// scheduled, speaking RESP directly like ping.
func waitAOFIdle(addr string) error {
	deadline := time.Now().Add(startTimeout)
	for {
		info, err := infoPersistence(addr)
		if err != nil {
			return err
		}
		if strings.Contains(info, "aof_rewrite_in_progress:0") &&
			strings.Contains(info, "aof_rewrite_scheduled:0") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("AOF rewrite still running after %v", startTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func infoPersistence(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("INFO persistence\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 {
		return "", fmt.Errorf("INFO answered %q", strings.TrimSpace(line))
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// ping speaks RESP directly so the helper depends on nothing but the server.
// A server still loading its AOF answers -LOADING, which is not ready.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server that asks for a password (Args with --requirepass) is up too.
	if l := strings.TrimSpace(line); l != "+PONG" && !strings.HasPrefix(l, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", l)
	}
	return nil
}

// Client returns a go-redis client of s alone (not following a cluster's
// redirects), closed in tb's cleanup.
func Client(tb testing.TB, s *Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Clients returns a go-redis client per server, in order, closed in tb's
// cleanup (before the servers are killed: cleanups run last-in first-out).
// Call it once per simulated instance: separate processes have separate
// connections.
func Clients(tb testing.TB, servers []*Server) []redis.UniversalClient {
	tb.Helper()
	cs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		tb.Cleanup(func() { _ = c.Close() })
		cs[i] = c
	}
	return cs
}
