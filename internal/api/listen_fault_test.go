package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"rain/internal/grab"
	"rain/internal/logtest"
	"rain/internal/pool"
	"rain/internal/wait/waittest"
)

// panicky is a grab service that panics on every grab.
type panicky struct{}

func (panicky) Grab(context.Context, string, string) (grab.Result, error) { panic("boom") }

// TestGrabThatPanicsIsAnswered503: a grab whose handling panics is
// answered as the contract has it, never 500: 503 overloaded, its outcome
// not known, Retry-After, with pool_id and user_id (API.md: always); the
// listener goes on serving, the process is not taken down with every grab
// in flight.
func TestGrabThatPanicsIsAnswered503(t *testing.T) {
	for _, workers := range []bool{false, true} {
		cfg := Config{Grabber: panicky{}}
		if workers {
			w, err := pool.New(pool.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { w.Close(5 * time.Second) })
			cfg.Runner = w
		}
		url := serve(t, New(cfg))
		for range 2 { // the second on a listener that survived the first
			resp, err := http.Post(url+"/grab", "application/json", strings.NewReader(`{"pool_id":"p","user_id":"u"}`))
			if err != nil {
				t.Fatalf("POST /grab (workers %v): %v", workers, err)
			}
			var body map[string]any
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			_, hasPool := body["pool_id"]
			_, hasUser := body["user_id"]
			if resp.StatusCode != 503 || body["status"] != "overloaded" || resp.Header.Get("Retry-After") == "" || !hasPool || !hasUser {
				t.Fatalf("a grab that panicked (workers %v) = %d %v (Retry-After %q), want 503 overloaded with Retry-After, pool_id and user_id",
					workers, resp.StatusCode, body, resp.Header.Get("Retry-After"))
			}
		}
	}
}

// TestServeOutlivesRunningOutOfFiles: the process out of file descriptors
// for a moment (a flood of connections near the limit) does not end Serve
// (and rain serve with it): accepting resumes once descriptors are free.
func TestServeOutlivesRunningOutOfFiles(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	a := New(Config{Grabber: panicky{}, MaxConns: 1 << 16, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := a.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- a.Serve() }()
	low := lim
	low.Cur = 64
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	// Every descriptor taken, then one freed for a client's connection:
	// the server's accept of it finds none.
	var held []*os.File
	for {
		f, err := os.Open(os.DevNull)
		if err != nil {
			break
		}
		held = append(held, f)
	}
	if len(held) == 0 {
		t.Fatal("no descriptor could be opened under the lowered limit")
	}
	held[len(held)-1].Close()
	held = held[:len(held)-1]
	c, err := net.Dial("tcp", a.Addr().String())
	if err != nil {
		t.Fatalf("dial with one descriptor free: %v", err)
	}
	// The accepts meanwhile fail (EMFILE), and are tried again.
	waittest.Until(t, 10*time.Second, "an accept that failed for want of descriptors", func() bool {
		return strings.Contains(logs.String(), "accept failed; trying again") && strings.Contains(logs.String(), "too many open files")
	})
	c.Close()
	for _, f := range held {
		f.Close()
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned while the process ran out of file descriptors for a moment: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + a.Addr().String() + "/livez")
	if err != nil {
		t.Fatalf("GET /livez once descriptors are free: %v", err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

// TestStopTakesTheBacklog: a connection the kernel completed but rain had
// not yet accepted when the listener stops is accepted (and its request
// answered), not reset by the socket's close.
func TestStopTakesTheBacklog(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &stoppable{TCPListener: tcp.(*net.TCPListener)}
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("POST /grab HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // in the backlog
	l.Stop()
	got, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept after Stop with a connection in the backlog = %v, want the connection", err)
	}
	got.Close()
	if _, err := l.Accept(); err != net.ErrClosed {
		t.Fatalf("Accept with the backlog taken = %v, want net.ErrClosed", err)
	}
}

// TestEarlyAnswerOutlivesALateBody: a grab answered before its body is
// read (a Content-Type that is not JSON; the instance stopping) whose body
// does not come in time has its connection closed lingering: a body that
// arrives after the answer and the close is read and dropped, not
// answered by a reset, which would destroy the answer before the client
// reads it.
func TestEarlyAnswerOutlivesALateBody(t *testing.T) {
	for _, c := range []struct {
		name, contentType string
		stop              bool
		code              int
	}{
		{"not JSON", "text/plain", false, 400},
		{"stopping", "application/json", true, 503},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := New(Config{Grabber: panicky{}})
			url := serve(t, a)
			if c.stop {
				a.Stop()
			}
			conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := `{"pool_id":"p","user_id":"u"}`
			if _, err := fmt.Fprintf(conn, "POST /grab HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", c.contentType, len(body)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond) // answered, and closed (past bodyUnreadWait)
			if _, err := conn.Write([]byte(body)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // a reset, if one comes, is here before the read
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("reading the answer after a late body: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.code {
				t.Fatalf("answer = %d, want %d", resp.StatusCode, c.code)
			}
		})
	}
}
