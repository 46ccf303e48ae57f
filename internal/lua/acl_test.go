package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"rain"
	"rain/internal/redistest"
)

// TestScriptsRunForAUserOfRainsKeysAlone: a Redis user allowed rain's keys
// alone (~rain:*, and rain's channel) runs every step of a sub-pool's life:
// the read every script makes first (of a key that never exists, for a slot
// being moved) is of a key named as rain's are. A user denied even that
// gets Redis's own refusal, not a TRYAGAIN that would send an operator
// looking for a slot move.
func TestScriptsRunForAUserOfRainsKeysAlone(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Client(t, srv)
	for _, acl := range [][]any{
		{"ACL", "SETUSER", "rain", "on", ">pw", "~rain:*", "&rain:*", "+@all"},
		{"ACL", "SETUSER", "other", "on", ">pw", "~other:*", "&rain:*", "+@all"},
	} {
		if err := admin.Do(ctx, acl...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "rain", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	sp := rain.SubPool{Pool: "p", Index: 0}
	openOne(t, c, sp, 42)
	k := sp.Keys()
	got, err := claimOne(ctx, c, &k, "u1", 77, "", 0)
	if err != nil || got.Outcome != Granted || got.Amount != 42 {
		t.Fatalf("claim by a user of rain's keys = %+v, %v; want granted 42", got, err)
	}
	if res, errs, err := ConfirmMany(ctx, c, &k, []ConfirmArg{{User: "u1", Serial: 77, Amount: 42}}); err != nil || errs[0] != nil || res[0].Result != Confirmed {
		t.Fatalf("confirm by a user of rain's keys = %+v, %v, %v", res, errs, err)
	}

	o := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "other", Password: "pw"})
	t.Cleanup(func() { o.Close() })
	_, err = claimOne(ctx, o, &k, "u2", 78, "", 0)
	if err == nil || redis.HasErrorPrefix(err, "TRYAGAIN") || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "access") {
		t.Fatalf("claim by a user denied rain's keys = %v; want Redis's refusal", err)
	}
}

// TestConfirmManyRefusesWhereNoSubPoolIs: a confirm on a node that holds
// none of the sub-pool's keys (a slot's keys split between two primaries
// by a move broken off) is refused, nothing written, rather than answered
// "unknown" for each grant, which settlement would acknowledge unpaid.
func TestConfirmManyRefusesWhereNoSubPoolIs(t *testing.T) {
	ctx := context.Background()
	c := newClient(t)
	k := rain.SubPool{Pool: "elsewhere", Index: 0}.Keys()
	res, errs, err := ConfirmMany(ctx, c, &k, []ConfirmArg{{User: "u1", Serial: 1, Amount: 10}})
	if err == nil || !strings.Contains(err.Error(), "RAINSTATE") {
		t.Fatalf("confirm where no sub-pool is = %+v, %v, %v; want refused", res, errs, err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("%d keys after the refused confirm, %v; want none", n, err)
	}
}
