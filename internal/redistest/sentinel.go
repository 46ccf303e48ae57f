package redistest

// This file starts Redis Sentinels.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartSentinel starts a Redis Sentinel (redis-server --sentinel) that
// watches the primary at primaryAddr under the name master, agreeing on a
// failure with quorum sentinels. It considers the primary down after
// downAfter without an answer. Like Start, it is stopped in tb's cleanup.
func StartSentinel(tb testing.TB, master, primaryAddr string, quorum int, downAfter time.Duration) *Server {
	tb.Helper()
	return StartSentinelAuth(tb, master, primaryAddr, quorum, downAfter, "")
}

// StartSentinelAuth is StartSentinel for a primary (and replicas) that
// require authPass (sentinel auth-pass); "" for none.
func StartSentinelAuth(tb testing.TB, master, primaryAddr string, quorum int, downAfter time.Duration, authPass string) *Server {
	tb.Helper()
	return startSentinel(tb, master, primaryAddr, quorum, downAfter, authPass, nil)
}

// StartSentinelTLS is StartSentinel that also answers over TLS on tl's
// port (tl.Port; Addr stays its plain port), and reaches the primary at
// primaryTLSAddr over TLS (tls-replication yes), with tl's certificate.
func StartSentinelTLS(tb testing.TB, master, primaryTLSAddr string, tl TLS) *Server {
	tb.Helper()
	return startSentinel(tb, master, primaryTLSAddr, 1, 5*time.Second, "", &tl)
}

func startSentinel(tb testing.TB, master, primaryAddr string, quorum int, downAfter time.Duration, authPass string, tl *TLS) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatal(Missing)
	}
	host, port, err := net.SplitHostPort(primaryAddr)
	if err != nil {
		tb.Fatalf("redistest: sentinel: primary %q: %v", primaryAddr, err)
	}
	s := &Server{tb: tb, bin: bin, opts: Options{sentinel: true}, Dir: tb.TempDir()}
	conf := fmt.Sprintf("sentinel monitor %s %s %s %d\n"+
		"sentinel down-after-milliseconds %s %d\n"+
		"sentinel failover-timeout %s 5000\n"+
		"sentinel parallel-syncs %s 1\n", master, host, port, quorum,
		master, downAfter.Milliseconds(), master, master)
	if authPass != "" {
		conf += fmt.Sprintf("sentinel auth-pass %s %s\n", master, authPass)
	}
	if tl != nil {
		conf += fmt.Sprintf("tls-port %d\ntls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\n"+
			"tls-auth-clients no\ntls-replication yes\n", tl.Port, tl.certFile, tl.keyFile, tl.CAFile)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "sentinel.conf"), []byte(conf), 0o644); err != nil {
		tb.Fatalf("redistest: sentinel: %v", err)
	}
	tb.Cleanup(s.Kill)
	var lastErr error
	for range 5 {
		if s.port, err = freePort(); err != nil {
			tb.Fatalf("redistest: free port: %v", err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	tb.Fatalf("redistest: start redis sentinel: %v", lastErr)
	return nil
}

// start runs the process and waits for PING.

// Replicated is a shard with a replica: a durable primary (AOF,
// appendfsync always), its replica, in sync when StartReplicated returns,
// and a Sentinel watching them as "rainm" that never fails them over.
type Replicated struct {
	Primary, Replica, Sentinel *Server
}

// StartReplicated starts a Replicated shard, stopped in tb's cleanup.
func StartReplicated(tb testing.TB) *Replicated {
	tb.Helper()
	durable := Options{AOF: true, Fsync: "always"}
	r := &Replicated{Primary: Start(tb, durable)}
	durable.ReplicaOf = r.Primary.Addr
	r.Replica = Start(tb, durable)
	r.Sentinel = StartSentinel(tb, "rainm", r.Primary.Addr, 1, time.Hour)
	rc := Client(tb, r.Replica)
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := rc.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: the replica %s not in sync with %s within 15s: %v", r.Replica.Addr, r.Primary.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Spec is the shard as rain's --redis names it: its Sentinel and master.
func (r *Replicated) Spec() string { return "sentinel/rainm/" + r.Sentinel.Addr }
