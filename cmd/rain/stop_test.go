package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"rain/internal/logtest"
	"rain/internal/wait/waittest"
)

// TestStopAnswersEveryRequest: clients send grabs back to back on many
// keep-alive connections across the stop (SIGTERM is the context's end),
// and honour Retry-After as the contract asks. Every request that reached
// rain is answered (200, or 503 with Retry-After once the drain delay is
// over) and its connection closed after the answer; a request may fail
// only by its dial being refused once the listener has closed (it never
// reached rain). None is cut off on a connection rain closed under it, nor
// reset in the listener's backlog. With a drain delay and without one.
func TestStopAnswersEveryRequest(t *testing.T) {
	for _, delay := range []string{"0", "300ms"} {
		t.Run("drain-delay="+delay, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			logs := &logtest.Buffer{}
			go func() {
				done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--drain-delay", delay, "--admin-token", "stop"}, env(nil), &bytes.Buffer{}, logs)
			}()
			addr := serving(t, logs, done)
			base := "http://" + addr
			waittest.Until(t, 10*time.Second, "rain serve healthy", func() bool {
				resp, err := http.Get(base + "/healthz")
				if err == nil {
					resp.Body.Close()
				}
				return err == nil
			})
			// A million packets: on a busy machine a round trip of the load
			// may outlast the shard timeout (503); the preload is idempotent
			// and resumes where it stopped, so it is sent again, as an
			// operator does.
			waittest.Until(t, 60*time.Second, "the pool preloaded", func() bool {
				code, body := post(t, base+"/admin/pools", "stop", `{"pool_id":"stop","total_cents":10000000,"count":1000000}`)
				if code != 201 && code != 200 && code != 503 {
					t.Fatalf("preload = %d %v", code, body)
				}
				if code == 503 {
					t.Logf("preload = %d %v; sent again", code, body)
				}
				return code != 503
			})

			const clients = 64
			var answered, afterStop, refusedDials atomic.Int64
			var stopped atomic.Bool
			var stopAt time.Time
			var mu sync.Mutex
			var dropped []string
			var wg sync.WaitGroup
			for c := range clients {
				tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
				defer tr.CloseIdleConnections()
				client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
				wg.Go(func() {
					for n := 0; ; n++ {
						var reused bool
						trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
						body := fmt.Sprintf(`{"pool_id":"stop","user_id":"c%d-%d"}`, c, n)
						req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "POST", base+"/grab", strings.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						resp, err := client.Do(req)
						if err != nil {
							var op *net.OpError
							if errors.As(err, &op) && op.Op == "dial" && stopped.Load() {
								refusedDials.Add(1) // the listener has closed: never reached rain
								return
							}
							mu.Lock()
							dropped = append(dropped, fmt.Sprintf("client %d request %d (reused connection %v) at %v: %v", c, n, reused, time.Since(stopAt), err))
							mu.Unlock()
							return
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						answered.Add(1)
						if stopped.Load() {
							afterStop.Add(1)
						}
						switch {
						case resp.StatusCode == 200:
						case resp.StatusCode == 503 && resp.Header.Get("Retry-After") != "":
							// As the contract asks of clients: come back after it.
							secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
							time.Sleep(time.Duration(max(secs, 1)) * time.Second)
						default:
							mu.Lock()
							dropped = append(dropped, fmt.Sprintf("client %d request %d: answered %d", c, n, resp.StatusCode))
							mu.Unlock()
							return
						}
					}
				})
			}
			// Grabs in flight on every connection when the stop comes; a busy
			// machine may take a while to get there.
			waittest.Until(t, 60*time.Second, "grabs flowing", func() bool { return answered.Load() > 500 })
			stopAt = time.Now()
			stopped.Store(true)
			cancel() // as SIGTERM does
			wg.Wait()
			if err := <-done; err != nil {
				t.Fatalf("serve: %v\n%s", err, logs)
			}
			t.Logf("%d grabs answered, %d of them after the stop; %d clients' dials refused after the listener closed",
				answered.Load(), afterStop.Load(), refusedDials.Load())
			for _, d := range dropped {
				t.Errorf("dropped: %s", d)
			}
			if refusedDials.Load() != clients {
				t.Errorf("%d of %d clients ended on a refused dial, want all (each sends until rain stops listening)", refusedDials.Load(), clients)
			}
		})
	}
}
