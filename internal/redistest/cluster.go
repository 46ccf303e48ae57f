package redistest

// This file starts a Redis Cluster of real redis-server processes on
// loopback, made with the cluster's own tool (redis-cli --cluster), and
// moves slots between its primaries while tests run.

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster owned by a test: Nodes[:primaries] are its
// primaries as created, the rest their replicas (a failover changes who is
// primary: ask the cluster).
type Cluster struct {
	Nodes []*Server

	tb   testing.TB
	opts Options
}

// StartCluster starts primaries cluster nodes and replicas replicas of
// each, makes them a cluster (redis-cli --cluster create, the slots spread
// evenly over the primaries) and waits until every node reports the
// cluster ok. opts apply to every node (Cluster is set).
func StartCluster(tb testing.TB, primaries, replicas int, opts Options) *Cluster {
	tb.Helper()
	opts.Cluster = true
	c := &Cluster{tb: tb, opts: opts}
	for range primaries * (1 + replicas) {
		c.Nodes = append(c.Nodes, Start(tb, opts))
	}
	args := append([]string{"--cluster", "create"}, Addrs(c.Nodes)...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	c.cli(args...)
	c.WaitOK()
	c.waitReplicas(primaries * replicas)
	return c
}

// waitReplicas waits (up to 30s) until every replica's link to its
// primary is up (one that never synced cannot take over in a failover) and
// every node knows all n replicas (the cluster's gossip spreads them).
func (c *Cluster) waitReplicas(n int) {
	c.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range c.Nodes {
		for {
			ctx := context.Background()
			info, err := c.client(s).Info(ctx, "replication").Result()
			nodes, nerr := c.client(s).ClusterNodes(ctx).Result()
			if err == nil && nerr == nil && strings.Count(nodes, " slave ")+strings.Count(nodes, ",slave ") == n &&
				(strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				c.tb.Fatalf("redistest: replica %s not in sync within 30s", s.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// cli runs redis-cli with args and fails the test when it fails.
func (c *Cluster) cli(args ...string) string {
	c.tb.Helper()
	out, err := exec.Command("redis-cli", args...).CombinedOutput()
	if err != nil {
		c.tb.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Seeds is the cluster's nodes as a shard spec's seed list,
// "host:port+host:port+...".
func (c *Cluster) Seeds() string { return strings.Join(Addrs(c.Nodes), "+") }

// client is a plain client of one node, closed when the test ends.
func (c *Cluster) client(s *Server) *redis.Client { return Client(c.tb, s) }

// WaitOK waits (up to 30s) until every node that runs says
// cluster_state:ok and agrees on who owns every slot.
func (c *Cluster) WaitOK() {
	c.tb.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := true, ""
		var first string
		for _, s := range c.Nodes {
			if s.PID() == 0 {
				continue
			}
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, Protocol: 2})
			info, err := cl.ClusterInfo(ctx).Result()
			slots, serr := cl.ClusterShards(ctx).Result()
			_ = cl.Close()
			if err != nil || !strings.Contains(info, "cluster_state:ok") || serr != nil {
				ok, why = false, fmt.Sprintf("%s: %v %v", s.Addr, err, serr)
				break
			}
			if view := fmt.Sprint(slotOwners(slots)); first == "" {
				first = view
			} else if view != first {
				ok, why = false, "the nodes disagree on the slots' owners"
				break
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("redistest: cluster not ok within 30s: %s", why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// slotOwners is the slot ranges and their primaries, for comparison.
func slotOwners(shards []redis.ClusterShard) []string {
	var out []string
	for _, sh := range shards {
		primary := shardPrimary(sh)
		if primary == "" {
			continue
		}
		for _, r := range sh.Slots {
			out = append(out, fmt.Sprintf("%d-%d:%s", r.Start, r.End, primary))
		}
	}
	slices.Sort(out)
	return out
}

// shardPrimary is the address of a shard's primary, "" when it lists none.
func shardPrimary(sh redis.ClusterShard) string {
	for _, n := range sh.Nodes {
		if n.Role == "master" {
			return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
		}
	}
	return ""
}

// Owner is the node that owns slot now, as the node at first answers.
func (c *Cluster) Owner(slot int) *Server {
	c.tb.Helper()
	for _, s := range c.Nodes {
		if s.PID() == 0 {
			continue
		}
		shards, err := c.client(s).ClusterShards(context.Background()).Result()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			primary := shardPrimary(sh)
			for _, r := range sh.Slots {
				if int64(slot) < r.Start || int64(slot) > r.End {
					continue
				}
				for _, n := range c.Nodes {
					if n.Addr == primary {
						return n
					}
				}
			}
		}
	}
	c.tb.Fatalf("redistest: no node owns slot %d", slot)
	return nil
}

// id is a node's cluster id.
func (c *Cluster) id(s *Server) string {
	c.tb.Helper()
	id, err := c.client(s).ClusterMyID(context.Background()).Result()
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER MYID of %s: %v", s.Addr, err)
	}
	return id
}

// MoveSlot moves slot, and its keys, from its owner to node to, as
// redis-cli --cluster reshard moves each slot: the target importing, the
// source migrating (BeginMove), the keys migrated (MIGRATE) a few at a time
// with pause between the batches (MoveKeys; while a slot is half moved, a
// command on it is redirected: ASK, TRYAGAIN), then the slot given to the
// target on every primary.
func (c *Cluster) MoveSlot(slot int, to *Server, pause time.Duration) {
	c.tb.Helper()
	if c.Owner(slot) == to {
		return
	}
	c.BeginMove(slot, to)
	c.MoveKeys(slot, to, pause)
	c.FinishMove(slot, to)
}

// FinishMove gives slot to node to on every primary, as a reshard's last
// step (redis-cli --cluster fix finishes a move that stopped before it),
// and waits for the cluster to agree.
func (c *Cluster) FinishMove(slot int, to *Server) {
	c.tb.Helper()
	ctx := context.Background()
	toID := c.id(to)
	for _, s := range c.Nodes {
		if s.PID() == 0 {
			continue
		}
		if role, err := c.client(s).Do(ctx, "ROLE").Slice(); err == nil && len(role) > 0 && role[0] == "master" {
			c.must(c.client(s).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID).Err(), "give slot %d to %s", slot, to.Addr)
		}
	}
	c.WaitOK()
}

// OtherPrimary is a primary of the cluster other than s (the first such),
// where a slot of s's may move.
func (c *Cluster) OtherPrimary(s *Server) *Server {
	c.tb.Helper()
	for _, n := range c.Nodes {
		if n == s || n.PID() == 0 {
			continue
		}
		if role, err := c.client(n).Do(context.Background(), "ROLE").Slice(); err == nil && len(role) > 0 && role[0] == "master" {
			return n
		}
	}
	c.tb.Fatalf("redistest: no primary but %s", s.Addr)
	return nil
}

// BeginMove starts moving slot from its owner to node to, its keys left
// where they are: to IMPORTING it, the owner MIGRATING it, as a reshard's
// first step. It returns the owner.
func (c *Cluster) BeginMove(slot int, to *Server) (from *Server) {
	c.tb.Helper()
	ctx := context.Background()
	from = c.Owner(slot)
	c.must(c.client(to).Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", c.id(from)).Err(), "import slot %d on %s", slot, to.Addr)
	c.must(c.client(from).Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", c.id(to)).Err(), "migrate slot %d from %s", slot, from.Addr)
	return from
}

// MoveKeys migrates every key of slot from its owner (as BeginMove left
// it) to node to, a few at a time with pause between the batches; the slot
// is not handed over (MoveSlot does that): a reshard stopped here leaves
// it half moved.
func (c *Cluster) MoveKeys(slot int, to *Server, pause time.Duration) {
	c.tb.Helper()
	ctx := context.Background()
	src := c.client(c.Owner(slot))
	host, port, _ := strings.Cut(to.Addr, ":")
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 3).Result()
		c.must(err, "keys of slot %d", slot)
		if len(keys) == 0 {
			return
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		c.must(src.Do(ctx, args...).Err(), "migrate keys of slot %d to %s", slot, to.Addr)
		time.Sleep(pause)
	}
}

// must fails the test with what it was doing when err is not nil.
func (c *Cluster) must(err error, doing string, args ...any) {
	c.tb.Helper()
	if err != nil {
		c.tb.Fatalf("redistest: "+doing+": %v", append(args, err)...)
	}
}

// AddPrimary starts a node and has it join the cluster as a primary
// without slots (redis-cli --cluster add-node); Rebalance gives it some.
func (c *Cluster) AddPrimary() *Server {
	c.tb.Helper()
	s := Start(c.tb, c.opts)
	c.cli("--cluster", "add-node", s.Addr, c.Nodes[0].Addr)
	c.Nodes = append(c.Nodes, s)
	id := c.id(s)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		info, err := c.client(s).ClusterInfo(context.Background()).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") && c.allKnow(id) {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.tb.Fatalf("redistest: %s did not join the cluster within 30s", s.Addr)
	return nil
}

// allKnow reports whether every live node knows the node id (gossip has
// spread it): a slot cannot be moved to a node its owner has not met.
func (c *Cluster) allKnow(id string) bool {
	for _, n := range c.Nodes {
		if n.PID() == 0 {
			continue
		}
		nodes, err := c.client(n).ClusterNodes(context.Background()).Result()
		if err != nil || !strings.Contains(nodes, id) {
			return false
		}
	}
	return true
}

// Rebalance spreads the slots evenly over the primaries, the empty ones
// included (redis-cli --cluster rebalance --cluster-use-empty-masters),
// moving them while clients work.
func (c *Cluster) Rebalance() {
	c.tb.Helper()
	for _, s := range c.Nodes {
		if s.PID() != 0 {
			c.cli("--cluster", "rebalance", s.Addr, "--cluster-use-empty-masters", "--cluster-yes")
			c.WaitOK()
			return
		}
	}
}
