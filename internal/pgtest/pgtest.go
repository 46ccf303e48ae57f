// Package pgtest starts real PostgreSQL servers for tests, as package
// redistest starts redis-server: each a private cluster made by initdb in a
// temporary directory, on a free port of 127.0.0.1, stopped when the test
// ends. rain's tests never mock the database.
//
// Run as root (CI's containers), the server runs as the postgres user, which
// PostgreSQL requires; the directory is then made that user's.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Missing is the message a test fails with when PostgreSQL's server
// programs cannot be found.
const Missing = "initdb and pg_ctl not found (on PATH or in /usr/lib/postgresql/*/bin): run scripts/test.sh, which installs them, " +
	"or install them yourself (Debian/Ubuntu: apt-get install -y postgresql)"

// Options configure a server.
type Options struct {
	// Durable keeps fsync on, as production runs: for benchmarks. Off
	// (the default) the server skips fsync, which tests do not need.
	Durable bool
}

// Server is one PostgreSQL server owned by a test.
type Server struct {
	// Addr is host:port.
	Addr string
	// Dir holds its data and its log.
	Dir string

	tb   testing.TB
	bin  string // the directory of initdb and pg_ctl
	opts string // the server's options (its port among them)
	dbs  atomic.Int64
}

// Start starts a server and registers its stop with tb's cleanup.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	bin := binDir()
	if bin == "" {
		tb.Fatal(Missing)
	}
	dir, err := os.MkdirTemp("", "rain-pg-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	s := &Server{Dir: dir, tb: tb, bin: bin}
	data := filepath.Join(dir, "data")
	if err := s.prepare(data); err != nil {
		tb.Fatal(err)
	}
	if out, err := s.run("initdb", "-D", data, "-A", "trust", "-U", "rain", "-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	fsync := "off"
	if opts.Durable {
		fsync = "on"
	}
	var lastErr error
	for range 5 { // a free port may be taken before the server binds it
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		serverOpts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=%s -c max_connections=200", port, dir, fsync)
		s.opts = serverOpts
		out, err := s.start()
		if lastErr = err; err == nil {
			tb.Cleanup(func() { _ = s.run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop").Run() })
			return s
		}
		lastErr = fmt.Errorf("%w\n%s\n%s", err, out, s.logTail())
	}
	tb.Fatalf("pgtest: start: %v", lastErr)
	return nil
}

// URL is the connection URL of the server's database db.
func (s *Server) URL(db string) string {
	return fmt.Sprintf("postgres://rain@%s/%s?sslmode=disable", s.Addr, db)
}

// NewDB creates a fresh, empty database and returns its URL: one server
// serves a package's tests, each test on a database of its own.
func (s *Server) NewDB(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d", s.dbs.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	return s.URL(name)
}

// prepare makes data's parent and data ready for the server's user.
func (s *Server) prepare(data string) error {
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgtest: running as root needs a postgres user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		return err
	}
	if err := os.Chown(s.Dir, uid, gid); err != nil {
		return err
	}
	return os.Chown(data, uid, gid)
}

// run is one of PostgreSQL's programs, as the postgres user when root.
func (s *Server) run(prog string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, prog)
	if os.Geteuid() == 0 {
		return exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "server.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// binDir finds the directory of initdb and pg_ctl: on PATH, or Debian's
// /usr/lib/postgresql/<version>/bin (not on PATH), the newest.
func binDir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "pg_ctl")); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "initdb")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start starts the server on its data directory and waits until it
// accepts connections.
func (s *Server) start() ([]byte, error) {
	return s.run("pg_ctl", "-D", filepath.Join(s.Dir, "data"), "-l", filepath.Join(s.Dir, "server.log"), "-o", s.opts,
		"-w", "-t", "30", "start").CombinedOutput()
}

// Stop stops the server now, as a crash would (a database that went down);
// the test's cleanup does nothing more.
func (s *Server) Stop() {
	_ = s.run("pg_ctl", "-D", filepath.Join(s.Dir, "data"), "-m", "immediate", "-w", "stop").Run()
}

// Restart starts a stopped (or killed) server again, on the same address
// and data.
func (s *Server) Restart() {
	s.tb.Helper()
	var out []byte
	var err error
	for range 3 { // after a kill, the old shared memory may take a moment to go
		if out, err = s.start(); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.tb.Fatalf("pgtest: restart: %v\n%s\n%s", err, out, s.logTail())
}

// Kill kills the server's postmaster with SIGKILL, as a crash of the
// database's process would, and waits until it and its backends are gone
// (a backend exits when it sees its postmaster die). Restart starts it
// again: PostgreSQL recovers from its write-ahead log. PID is the
// postmaster's process id (0 while it is down).
func (s *Server) Kill() {
	s.tb.Helper()
	pid := s.PID()
	if pid == 0 {
		return
	}
	procs := append([]int{pid}, children(pid)...)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for syscall.Kill(p, 0) == nil {
			if time.Now().After(deadline) {
				s.tb.Fatalf("pgtest: kill: process %d still runs 30s after its postmaster was killed", p)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// PID is the running postmaster's process id, from its lock file; 0 when
// the server is down.
func (s *Server) PID() int {
	b, err := os.ReadFile(filepath.Join(s.Dir, "data", "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || syscall.Kill(pid, 0) != nil {
		return 0
	}
	return pid
}

// children lists the processes whose parent is pid (from /proc).
func children(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces; cut after its ')'.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		fields := strings.Fields(rest)
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			out = append(out, p)
		}
	}
	return out
}
