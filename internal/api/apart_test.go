package api

import (
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestServeApartStopsAtOnce: a listener stopped right after it was served
// (rain serve's side listeners when a later one fails to open) stops, even
// when its server had not begun to serve yet. Before, the stop found no
// listener to close, and waited for good on a server that then served.
func TestServeApartStopsAtOnce(t *testing.T) {
	for i := range 300 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		stop := ServeApart(ln, http.NotFoundHandler(), WriteTimeout, time.Second, slog.New(slog.DiscardHandler))
		done := make(chan struct{})
		go func() { stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("stop %d, right after the listener was served, did not return", i)
		}
	}
}
