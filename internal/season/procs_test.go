package season

// This file runs rain as processes of their own: built once, started on
// port 0 with the address read from their log, killed with SIGKILL and
// started again.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"rain/internal/logtest"
)

var (
	buildOnce sync.Once
	binDir    string // removed by TestMain
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// rainBinary builds cmd/rain once for the package's tests.
func rainBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "rain-season-"); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "rain")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/rain")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/rain: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

var servingRE = regexp.MustCompile(`msg=serving addr=(\S+)`)

// proc is one rain process: rain serve or rain settle, listening on port
// 0 and logging the address it serves on.
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	env  []string

	mu     sync.Mutex // guards the fields below
	cmd    *exec.Cmd
	exited chan struct{}   // closed when cmd has exited
	logs   *logtest.Buffer // this run's log
	all    strings.Builder
	addr   string
	runs   int
}

// startProc starts a process, waits until it serves, and stops it (SIGTERM)
// when the test ends.
func startProc(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, args: args, env: env}
	p.start()
	t.Cleanup(p.stop)
	return p
}

// start runs the process and waits (up to 60s) for its "serving" line.
func (p *proc) start() {
	p.t.Helper()
	logs := &logtest.Buffer{}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited, p.logs, p.runs = cmd, exited, logs, p.runs+1
	p.mu.Unlock()
	deadline := time.After(60 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(logs.String()); m != nil {
			p.mu.Lock()
			p.addr = m[1]
			p.mu.Unlock()
			return
		}
		select {
		case <-exited:
			p.t.Fatalf("%s exited before it served:\n%s", p.name, logs)
		case <-deadline:
			p.t.Fatalf("%s did not serve within 60s:\n%s", p.name, logs)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Addr is where the process serves now ("" while it is down).
func (p *proc) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// PID is the running process's id.
func (p *proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the process to be gone: a crash.
func (p *proc) kill() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.addr = ""
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	p.keepLog()
}

// keepLog adds this run's log to every run's.
func (p *proc) keepLog() {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(&p.all, "--- %s run %d\n%s", p.name, p.runs, p.logs.String())
}

// stop ends the process as an orchestrator does (SIGTERM, then SIGKILL
// after 15s) and, when the test failed, shows its log.
func (p *proc) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	select {
	case <-exited:
	default:
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		p.keepLog()
	}
	if p.t.Failed() {
		p.mu.Lock()
		defer p.mu.Unlock()
		out := p.all.String()
		if len(out) > 20_000 {
			out = "...\n" + out[len(out)-20_000:]
		}
		p.t.Logf("%s's log:\n%s", p.name, out)
	}
}

// rssMB is the resident memory of process pid, in MB (from /proc).
func rssMB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// pgRSS is the resident memory of PostgreSQL (its postmaster and every
// process it started), in MB.
func pgRSS(postmaster int) float64 {
	if postmaster == 0 {
		return 0
	}
	total := rssMB(postmaster)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(postmaster) {
			pid, _ := strconv.Atoi(e.Name())
			total += rssMB(pid)
		}
	}
	return total
}

// usedMemory is used_memory_human of an INFO memory answer.
func usedMemory(info string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_human:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
