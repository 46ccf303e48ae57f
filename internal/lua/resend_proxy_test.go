package lua

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"rain"
	"rain/internal/redisproxy"
	"rain/internal/redistest"
	"rain/internal/shard"
)

// TestEveryStepResentAfterALostReply: each script runs through a proxy that
// swallows its first reply and resets the connection, on a client with
// rain serve's options, whose retry sends the script again. The reply to
// the re-send must be the very reply that was lost (byte for byte), except
// where the step says otherwise: confirm and confirm_many answer "already",
// the consumer group "exists" where it was created, and a batch
// load "skipped" (the same effect: the caller reads the next batch from
// either), release's hint of when to look again moves with the clock, and a
// serial reservation sent again reserves a new segment.
func TestEveryStepResentAfterALostReply(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Options{})
	p := redisproxy.Start(t, srv.Addr)
	c := shard.NewClient(p.Addr, shard.Options{})
	t.Cleanup(func() { c.Close() })
	h := openSubPool(t, c, 0, 60_000, 10)
	j := openSubPool(t, c, 1, 60_000, 20, 30)
	m := openSubPool(t, c, 3, 60_000, 5, 6) // for claim_many
	e := openSubPool(t, c, 4, 60_000, 9)    // ended and sealed
	p.Record()
	const valid = 60_000

	steps := []struct {
		script string
		run    func() error
		same   bool
	}{
		{"claim_many", func() error { _, err := claimOne(ctx, c, &h, "u1", 101, "101", valid); return err }, true},
		{"claim_many", func() error {
			_, _, err := ClaimMany(ctx, c, &m, valid, []ClaimArg{{"m1", 201, "201"}, {"m2", 202, "202"}, {"m1", 203, "203"}})
			return err
		}, true},
		{"claim_many", func() error { _, err := claimOne(ctx, c, &h, "u2", 102, "102", valid); return err }, true},
		{"take", func() error { _, _, err := Take(ctx, c, &j, "102", 0, "u2", 0); return err }, true},
		{"adopt", func() error { _, _, err := Adopt(ctx, c, &h, "u2", "102", 102, 20, 1, valid, 0); return err }, true},
		{"ack", func() error { _, err := Ack(ctx, c, &j, "102"); return err }, true},
		{"claim_many", func() error { _, err := claimOne(ctx, c, &h, "u3", 103, "103", valid); return err }, true},
		{"take", func() error { _, _, err := Take(ctx, c, &j, "103", 0, "u3", 0); return err }, true},
		{"decide", func() error { _, err := Decide(ctx, c, &h, "103", "u3", 0); return err }, true},
		{"adopt", func() error { _, _, err := Adopt(ctx, c, &h, "u3", "103", 103, 30, 1, valid, 0); return err }, true},
		{"ack", func() error { _, err := Untake(ctx, c, &j, "103"); return err }, true},
		{"claim_many", func() error { _, err := claimOne(ctx, c, &h, "u4", 104, "104", valid); return err }, true},
		{"abort", func() error { _, err := Abort(ctx, c, &h, "u4", "104", true); return err }, true},
		{"confirm", func() error { _, err := Confirm(ctx, c, &h, "u1", 101); return err }, false},
		{"confirm_many", func() error {
			_, _, err := ConfirmMany(ctx, c, &h, []ConfirmArg{{"u2", 102, 20}, {"u1", 101, 10}})
			return err
		}, false},
		{"end", func() error { _, err := End(ctx, c, &e); return err }, true},
		{"seal", func() error { _, err := Seal(ctx, c, &e, "owner", time.Minute); return err }, true},
		{"retire", func() error { _, _, err := Retire(ctx, c, rain.SubPool{Pool: "r", Index: 4}); return err }, true},
		// group answers "exists" where it created the group.
		{"group", func() error { _, err := EnsureGroup(ctx, c, &m, "settle"); return err }, false},
		{"acknowledge", func() error {
			ids, err := c.XRange(ctx, m.Outbox, "-", "+").Result()
			if err != nil || len(ids) == 0 {
				return fmt.Errorf("outbox of m: %v, %v", ids, err)
			}
			return Acknowledge(ctx, c, m.Outbox, "settle", []string{ids[0].ID}) // one call: the re-send is go-redis's
		}, true},
		// release's answer ends with how long until the next grant falls
		// due, which moves with the clock between the two runs.
		{"release", func() error { _, err := ReleaseExpired(ctx, c, &h, 10); return err }, false},
		// record answers that it did not move the record where it moved it
		// (a preload then answers 200 for the pool it opened); the record
		// is the same.
		{"record", func() error {
			_, _, err := PutRecord(ctx, c, "rain:{r}:pool", map[string]string{"spec": "s", "seed": "1", "placement": "a", "state": "open"})
			return err
		}, false},
		{"watermark", func() error { _, err := RaiseWatermark(ctx, c, "rain:serial:watermark", 500); return err }, true},
		{"setup", func() error {
			_, _, err := Setup(ctx, c, rain.SubPool{Pool: "r", Index: 0}, 1, 10, Window{HoldMS: 60_000})
			return err
		}, true},
		{"open", func() error { _, _, _, err := OpenSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 0}); return err }, true},
		{"audit", func() error { _, err := AuditSubPool(ctx, c, rain.SubPool{Pool: "r", Index: 1}); return err }, true},
		{"transfers", func() error { _, err := StaleTransfers(ctx, c, &j, valid, 0); return err }, true},
		{"serial", func() error { _, err := ReserveSerials(ctx, c, "rain:serial", 100, 0); return err }, false},
		// A mark sent twice counts twice: only a change in the count matters.
		{"due_mark", func() error { return MarkDue(ctx, c, -time.Hour, []string{h.Meta, j.Meta}) }, true},
		// read answers how long until the next sub-pool is due, which moves
		// with the clock between the two runs.
		{"due_read", func() error { _, _, err := ReadDue(ctx, c, 0, 10); return err }, false},
		// done moves j's next look a minute on, from the clock of each run.
		{"due_done", func() error {
			due, _, err := ReadDue(ctx, c, 0, 10)
			if err != nil || len(due) != 2 {
				return fmt.Errorf("due = %v, %v", due, err)
			}
			_, err = DoneDue(ctx, c, due[1], time.Minute)
			return err
		}, false},
		{"load", func() error {
			sp := rain.SubPool{Pool: "r", Index: 2}
			if _, _, err := Setup(ctx, c, sp, 2, 3, Window{HoldMS: 1}); err != nil {
				return err
			}
			if res, next := load(t, c, sp, 0, 1, 2); next != 1 || (res != Loaded && res != Skipped) {
				return fmt.Errorf("load = %s, next %d; want next 1", res, next)
			}
			return nil
		}, false},
	}
	for i, step := range steps {
		name := fmt.Sprintf("step %d (%s)", i+1, step.script)
		before := len(p.Exchanges())
		p.DropReplies(redisproxy.Script(SHA(step.script)), 1)
		if err := step.run(); err != nil {
			t.Fatalf("%s after a lost reply: %v (rain serve's client retries)", name, err)
		}
		var lost, resent []byte
		for _, e := range p.Exchanges()[before:] {
			if e.Cmd[0] != "EVALSHA" || e.Cmd[1] != SHA(step.script) {
				continue
			}
			if e.Swallowed {
				lost = e.Reply
			} else if lost != nil && resent == nil {
				resent = e.Reply
			}
		}
		if lost == nil || resent == nil {
			t.Fatalf("%s: the proxy saw no lost reply and re-send (lost %q, re-sent %q)", name, lost, resent)
		}
		if step.same && !bytes.Equal(lost, resent) {
			t.Errorf("%s answered %q, then %q when sent again after the loss; want the same", name, lost, resent)
		}
	}
	if got, want := p.Stats().RepliesSwallowed["EVALSHA"], len(steps); got != want {
		t.Fatalf("%d script replies swallowed, want %d", got, want)
	}
	// Every script rain has is covered above.
	covered := map[string]bool{}
	for _, s := range steps {
		covered[s.script] = true
	}
	for name := range scripts {
		if !covered[name] {
			t.Errorf("script %s is not sent again in this test", name)
		}
	}
}
