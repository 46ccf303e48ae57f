package shard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"rain/internal/redistest"
)

// TestCheckClusters: a cluster shard is checked at start as rain needs it.
// A whole cluster passes; a standalone server given as cluster/ is no
// cluster, nor is one with a slot no primary serves (ErrNotACluster, which
// rain serve reports as a usage error), and seeds nobody answers are
// unreachable, not "no cluster".
func TestCheckClusters(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 0, redistest.Options{})
	alone := redistest.Start(t, redistest.Options{})
	dead := redistest.Start(t, redistest.Options{})
	dead.Kill()
	// A cluster one of whose slots no primary serves (every node forgot it).
	holed := redistest.StartCluster(t, 3, 0, redistest.Options{})
	for _, n := range holed.Nodes {
		nc := redis.NewClient(&redis.Options{Addr: n.Addr})
		err := nc.ClusterDelSlots(ctx, 100).Err()
		nc.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		spec    string
		want    error // nil: passes
		wantAny bool  // fails, not as ErrNotACluster
	}{
		{spec: "c1=1@cluster/" + cl.Seeds()},
		{spec: "c1=1@cluster/" + alone.Addr, want: ErrNotACluster},
		{spec: "c1=1@cluster/" + dead.Addr, wantAny: true},
		{spec: "c1=1@cluster/" + holed.Seeds(), want: ErrNotACluster},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			specs, err := ParseSpecs(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			set, err := Open(specs, 0, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer set.Close()
			err = set.CheckClusters(ctx)
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("CheckClusters = %v, want %v", err, tc.want)
			case tc.wantAny && (err == nil || errors.Is(err, ErrNotACluster)):
				t.Fatalf("CheckClusters = %v, want an error that is not ErrNotACluster", err)
			case tc.want == nil && !tc.wantAny && err != nil:
				t.Fatalf("CheckClusters = %v", err)
			}
		})
	}
}

// TestOnNodeIsToldOfEveryPrimary: the cluster client tells Options.OnNode
// the durability of each primary it meets (here: none persists), and of no
// replica.
func TestOnNodeIsToldOfEveryPrimary(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 1, redistest.Options{})
	var (
		mu  sync.Mutex
		met []string
	)
	set := openCluster(t, cl, Options{OnNode: func(d Durability) {
		mu.Lock()
		defer mu.Unlock()
		if d.Err != nil || d.Durable() {
			t.Errorf("told %s, want a primary that does not persist", d)
		}
		met = append(met, d.Shard)
	}})
	ps, err := set.Primaries(ctx, "c1")
	if err != nil || len(ps) != 3 {
		t.Fatalf("Primaries = %v, %v", ps, err)
	}
	var want []string
	for i := range 300 { // keys over every primary's slots
		if err := set.Client("c1").Set(ctx, fmt.Sprintf("k%d", i), 1, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range ps {
		want = append(want, "c1/"+p.Addr)
	}
	slices.Sort(want)
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		got := slices.Clone(met)
		mu.Unlock()
		slices.Sort(got)
		got = slices.Compact(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("told of %s, want the primaries %s", strings.Join(got, " "), strings.Join(want, " "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClusterAnnouncingHostnames: a cluster whose nodes announce hostnames
// (cluster-preferred-endpoint-type hostname, as managed services do): its
// primaries are named as its slot map names them, so rain's per-primary
// work finds them, and a primary with a replica is known to have one (its
// writes wait for it).
func TestClusterAnnouncingHostnames(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 1, redistest.Options{Args: []string{
		"--cluster-announce-hostname", "localhost", "--cluster-preferred-endpoint-type", "hostname"}})
	set := openCluster(t, cl, Options{})
	ps, err := set.Primaries(ctx, "c1")
	if err != nil || len(ps) != 3 {
		t.Fatalf("Primaries = %v, %v", ps, err)
	}
	for _, p := range ps {
		if !strings.HasPrefix(p.Addr, "localhost:") || p.Replicas != 1 {
			t.Errorf("primary %+v: want it named by its hostname, with its replica", p)
		}
	}
	for i := range 50 {
		key := fmt.Sprintf("k%d", i)
		owner, err := set.Owner(ctx, "c1", key)
		if err != nil {
			t.Fatal(err)
		}
		var p *Primary
		for i := range ps {
			if ps[i].Owns(Slot(key)) {
				p = &ps[i]
			}
		}
		if p == nil || p.Addr != owner {
			t.Fatalf("the slot map names %s the owner of %s; Primaries says %+v", owner, key, p)
		}
		if _, replicated, err := set.Writer(ctx, "c1", key); err != nil || !replicated {
			t.Fatalf("Writer(%s) replicated = %v, %v; want a wait for the replica", key, replicated, err)
		}
	}
}

// openCluster is a set of one shard, c1, the cluster cl; closed when the
// test ends.
func openCluster(t *testing.T, cl *redistest.Cluster, opts Options) *Set {
	t.Helper()
	specs, err := ParseSpecs("c1=1@cluster/" + cl.Seeds())
	if err != nil {
		t.Fatal(err)
	}
	set, err := Open(specs, 0, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	return set
}

// TestWriterStaysOnTheNodeItChecked: a write through Writer runs on the
// primary whose replicas it asked about, or not at all. With the slot map
// behind the cluster's (the key's slot moved since it was read), the write
// answers MOVED and nothing runs on the slot's new owner: the cluster's
// client would follow the MOVED there, to a primary whose replicas nobody
// asked about, and a write that must wait for a replica would go unwaited.
// Redirected has the map read again, and the next Writer goes to the new
// owner.
func TestWriterStaysOnTheNodeItChecked(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3, 0, redistest.Options{})
	set := openCluster(t, cl, Options{})
	const key = "{w}:k"
	if _, err := set.Owner(ctx, "c1", key); err != nil { // the map, read now
		t.Fatal(err)
	}
	if ps, err := set.Primaries(ctx, "c1"); err != nil || len(ps) != 3 { // and each primary's replicas: none
		t.Fatalf("Primaries = %v, %v", ps, err)
	}
	slot := Slot(key)
	from := cl.Owner(slot)
	to := cl.Nodes[slices.IndexFunc(cl.Nodes, func(n *redistest.Server) bool { return n != from })]
	cl.MoveSlot(slot, to, 0)
	c, _, err := set.Writer(ctx, "c1", key)
	if err != nil {
		t.Fatal(err)
	}
	werr := c.Set(ctx, key, "v", 0).Err()
	if !redis.HasErrorPrefix(werr, "MOVED") {
		t.Fatalf("a write through Writer with the map behind = %v; want MOVED, nothing run", werr)
	}
	if v, err := redistest.Client(t, to).Get(ctx, key).Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("the new owner holds %q, %v: the write ran there", v, err)
	}
	if err := set.Redirected(ctx, "c1", werr); err != werr {
		t.Fatalf("Redirected returned %v, want its error", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		owner, err := set.Owner(ctx, "c1", key)
		if err == nil && owner == to.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the map names %s the owner 10 s after Redirected (%v), want %s", owner, err, to.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, _, err = set.Writer(ctx, "c1", key)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
		t.Fatalf("a write once the map follows: %v", err)
	}
}

// TestRedirectAddr: a MOVED or ASK answer's node, as rain dials and names
// nodes: an IPv6 host, which Redis writes without brackets, gets them.
func TestRedirectAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:7001":   "127.0.0.1:7001",
		"::1:7001":         "[::1]:7001",
		"fe80::2:6379":     "[fe80::2]:6379",
		"[::1]:7001":       "[::1]:7001",
		"redis-0.svc:6379": "redis-0.svc:6379",
	} {
		if got := RedirectAddr(in); got != want {
			t.Errorf("RedirectAddr(%q) = %q, want %q", in, got, want)
		}
	}
	if addr, ok := AskedTo(errors.New("ASK 1661 ::1:7001")); !ok || addr != "[::1]:7001" {
		t.Errorf("AskedTo(an IPv6 ASK) = %q, %v", addr, ok)
	}
	if _, ok := AskedTo(errors.New("MOVED 1661 127.0.0.1:7001")); ok {
		t.Error("AskedTo(a MOVED) ok")
	}
}
