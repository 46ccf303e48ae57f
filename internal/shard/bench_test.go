package shard

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"rain/internal/redistest"
)

// BenchmarkRoundTrip is the CPU one round trip to a shard costs this
// process: one EVALSHA of a script that only counts its arguments, with a
// batch of 13 claims' arguments (three each) and a sub-pool's seven keys,
// the shape of a lane's batch; on a client with rain's options (a
// pipeline, as the lane sends it), and as bytes written to a bare
// connection and its one-line answer read back (the floor: the kernel's
// send, receive and wake-ups, without go-redis). One round trip at a time,
// so each waits for its answer as a lane does. client-us/op is this
// process's user and system CPU per round trip (getrusage), Redis's own is
// not in it.
func BenchmarkRoundTrip(b *testing.B) {
	ctx := context.Background()
	srv := redistest.Start(b, redistest.Options{})
	c := NewClient(srv.Addr, Options{})
	b.Cleanup(func() { c.Close() })
	sha, err := c.ScriptLoad(ctx, "return #ARGV").Result()
	if err != nil {
		b.Fatal(err)
	}
	keys := make([]string, 7)
	for i := range keys {
		keys[i] = fmt.Sprintf("rain:{p:0}:k%d", i)
	}
	args := make([]any, 3*13)
	for i := range args {
		args[i] = fmt.Sprintf("u%08d", i)
	}
	b.Run("go-redis", func(b *testing.B) {
		cpu := startCPU(b)
		for b.Loop() {
			pipe := c.Pipeline()
			cmd := pipe.EvalSha(ctx, sha, keys, args...)
			if _, err := pipe.Exec(ctx); err != nil || cmd.Val() != int64(len(args)) {
				b.Fatalf("EVALSHA = %v, %v; want %d", cmd.Val(), err, len(args))
			}
		}
		cpu.report(b)
	})
	b.Run("conn", func(b *testing.B) {
		conn, err := net.Dial("tcp", srv.Addr)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		msg := appendBulk(fmt.Appendf(nil, "*%d\r\n", 3+len(keys)+len(args)), "EVALSHA", sha, strconv.Itoa(len(keys)))
		msg = appendBulk(msg, keys...)
		for _, a := range args {
			msg = appendBulk(msg, a.(string))
		}
		want := fmt.Sprintf(":%d\r\n", len(args))
		r := bufio.NewReader(conn)
		cpu := startCPU(b)
		for b.Loop() {
			if _, err := conn.Write(msg); err != nil {
				b.Fatal(err)
			}
			if line, err := r.ReadString('\n'); err != nil || line != want {
				b.Fatalf("answer %q, %v; want %q", line, err, want)
			}
		}
		cpu.report(b)
	})
}

// appendBulk appends each of ss to b as a RESP bulk string.
func appendBulk(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = fmt.Appendf(b, "$%d\r\n%s\r\n", len(s), s)
	}
	return b
}

// cpuMeter is this process's user and system CPU since it started.
type cpuMeter struct{ at time.Duration }

func startCPU(b *testing.B) cpuMeter { return cpuMeter{at: processCPU(b)} }

// report reports the CPU per op since the meter started (client-us/op).
func (m cpuMeter) report(b *testing.B) {
	b.ReportMetric(float64(processCPU(b)-m.at)/float64(b.N)/1e3, "client-us/op")
}

func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
