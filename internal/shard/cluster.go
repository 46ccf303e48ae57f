package shard

// This file is a shard that is a whole Redis Cluster: its client (go-redis's
// ClusterClient, which follows the cluster's slot map, MOVED and ASK), its
// primaries as they stand, and rain's own client of each node, for the work
// that must stay on one connection of one primary (a batch of claims and
// the WAIT that follows it).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Primary is one primary of a cluster shard, as CLUSTER SHARDS reports it.
type Primary struct {
	ID       string     // its node id
	Addr     string     // host:port, as the cluster announces it
	Slots    [][2]int64 // the slot ranges it owns, inclusive
	Replicas int        // its replicas the cluster has not marked failed
}

// Owns reports whether the primary owns slot.
func (p Primary) Owns(slot int) bool {
	for _, r := range p.Slots {
		if int64(slot) >= r[0] && int64(slot) <= r[1] {
			return true
		}
	}
	return false
}

// cluster is the state of one cluster shard.
type cluster struct {
	name string
	spec ClusterShard
	opts Options
	c    *redis.ClusterClient

	refreshing atomic.Bool // a background read of the primaries is under way (refresh)

	mu       sync.Mutex               // guards nodes and replicas
	nodes    map[string]*redis.Client // rain's own client of each node, by address
	replicas map[string]int           // replicas of each primary not marked failed, by address (Primaries)
}

// newCluster opens the client of a cluster shard (no I/O).
func newCluster(name string, sh ClusterShard, opts Options) *cluster {
	o := &redis.ClusterOptions{
		Addrs: sh.Seeds, Username: sh.Username, Password: sh.Password,
		Protocol: 2, ContextTimeoutEnabled: true, PoolSize: opts.PoolSize,
		ReadTimeout: opts.Timeout, WriteTimeout: opts.Timeout, PoolTimeout: opts.Timeout,
		DialTimeout: opts.Timeout / 4, DialerRetries: 1,
		// A claim whose slot moves is sent where the cluster says, a few
		// times: a slot moves once, an ASK leads to its new owner.
		MaxRedirects: 8,
		TLSConfig:    clusterTLS(sh, opts),
	}
	dial := redis.NewDialer(&redis.Options{DialTimeout: o.DialTimeout, TLSConfig: o.TLSConfig})
	o.Dialer = refusedDialer(dial)
	cl := &cluster{name: name, spec: sh, opts: opts, c: redis.NewClusterClient(o),
		nodes: map[string]*redis.Client{}, replicas: map[string]int{}}
	if opts.OnNode != nil {
		cl.c.OnNewNode(func(node *redis.Client) { go cl.checkNode(node) })
	}
	cl.c.AddHook(reloadOnLoss{cl.c})
	return cl
}

// reloadOnLoss has a cluster client read the slot map again when a call
// failed without a reply from the server (a node refused, reset, timed
// out). go-redis reads it again on MOVED and every minute; a primary that
// died and whose replica took over answers no MOVED, so without this the
// client would go on sending its slots' keys to the dead address until the
// minute is up. Reads are coalesced (one at a time, 200ms apart).
type reloadOnLoss struct{ c *redis.ClusterClient }

func (h reloadOnLoss) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnLoss) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.after(ctx, err)
		return err
	}
}

func (h reloadOnLoss) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.after(ctx, err)
		return err
	}
}

func (h reloadOnLoss) after(ctx context.Context, err error) {
	if lostNode(err) {
		h.c.ReloadState(ctx)
	}
}

// lostNode reports whether err is a call's failure with no reply from the
// node (or a reply saying the cluster is down): its slots may have moved
// to another node.
func lostNode(err error) bool {
	var reply redis.Error
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return false
	case errors.As(err, &reply):
		return redis.HasErrorPrefix(err, "CLUSTERDOWN")
	}
	return true
}

// checkNode tells Options.OnNode the durability of a node the cluster
// client met, when it is a primary.
func (cl *cluster) checkNode(node *redis.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*cl.opts.Timeout)
	defer cancel()
	role, err := node.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		return // a replica, or gone: a primary it becomes is met again
	}
	cl.opts.OnNode(durabilityOf(ctx, cl.name+"/"+node.Options().Addr, node))
}

// clusterTLS is the TLS configuration of a cluster+tls/ shard's nodes;
// nil for cluster/.
func clusterTLS(sh ClusterShard, opts Options) *tls.Config {
	if !sh.TLS {
		return nil
	}
	if opts.TLS != nil {
		return opts.TLS.Clone()
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// refusedDialer makes a refused dial the error refused (see there).
func refusedDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
			return nil, refused(err.Error())
		}
		return c, err
	}
}

// node returns rain's own client of the node at addr, made on first use
// with the shard's credentials, TLS and options.
func (cl *cluster) node(addr string) *redis.Client {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if c := cl.nodes[addr]; c != nil {
		return c
	}
	o := &redis.Options{
		Addr: addr, Username: cl.spec.Username, Password: cl.spec.Password,
		Protocol: 2, ContextTimeoutEnabled: true, PoolSize: cl.opts.PoolSize,
		ReadTimeout: cl.opts.Timeout, WriteTimeout: cl.opts.Timeout, PoolTimeout: cl.opts.Timeout,
		DialTimeout: cl.opts.Timeout / 4, DialerRetries: 1, TLSConfig: clusterTLS(cl.spec, cl.opts),
	}
	o.Dialer = refusedDialer(redis.NewDialer(o))
	c := redis.NewClient(o)
	cl.nodes[addr] = c
	return c
}

// primaries reads the cluster's primaries (CLUSTER SHARDS), sorted by node
// id, and keeps how many replicas each has (not marked failed).
func (cl *cluster) primaries(ctx context.Context) ([]Primary, error) {
	shards, err := cl.c.ClusterShards(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("shard %s: CLUSTER SHARDS: %w", cl.name, err)
	}
	var out, all []Primary // with slots; all, those without too
	for _, sh := range shards {
		var p Primary
		for _, n := range sh.Nodes {
			switch {
			case n.Role == "master" && n.Health == "online":
				p.ID, p.Addr = n.ID, cl.endpoint(n)
			case n.Role == "replica" && n.Health != "failed":
				// online, or loading (syncing; or no write replicated
				// yet, as a new cluster's replicas say): writes wait
				// for it, as they would with Sentinel.
				p.Replicas++
			}
		}
		if p.ID == "" {
			continue // no primary online
		}
		all = append(all, p)
		if len(sh.Slots) == 0 {
			continue // a primary without slots (yet): no unit of placement
		}
		for _, r := range sh.Slots {
			p.Slots = append(p.Slots, [2]int64{r.Start, r.End})
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("shard %s: the cluster has no primary with slots (is it a cluster?)", cl.name)
	}
	slices.SortFunc(out, func(a, b Primary) int { return cmpString(a.ID, b.ID) })
	// The cluster's view of a primary's replicas spreads by gossip: one
	// attached a moment ago may not show yet. The primary's own (ROLE: the
	// replicas its stream goes to) counts too, the larger wins.
	counts := make(map[string]int, len(all))
	for _, p := range all {
		counts[p.Addr] = max(p.Replicas, cl.attached(ctx, p.Addr))
	}
	for i := range out {
		out[i].Replicas = counts[out[i].Addr]
	}
	cl.mu.Lock()
	clear(cl.replicas)
	maps.Copy(cl.replicas, counts)
	cl.mu.Unlock()
	return out, nil
}

// attached is how many replicas the primary at addr streams its writes to
// (ROLE); 0 when it does not answer.
func (cl *cluster) attached(ctx context.Context, addr string) int {
	role, err := cl.node(addr).Do(ctx, "ROLE").Slice()
	if err != nil || len(role) < 3 || role[0] != "master" {
		return 0
	}
	replicas, _ := role[2].([]any)
	return len(replicas)
}

// endpoint is the address the cluster's slot map gives node n, which the
// cluster client (and so Owner) names it by: its preferred endpoint (a
// hostname when the cluster announces hostnames), else its IP; its TLS
// port on a cluster+tls/ shard.
func (cl *cluster) endpoint(n redis.Node) string {
	host := n.Endpoint
	if host == "" || host == "?" {
		host = n.IP
	}
	port := n.Port
	if cl.spec.TLS && n.TLSPort > 0 || port == 0 {
		port = n.TLSPort
	}
	return net.JoinHostPort(host, strconv.FormatInt(port, 10))
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// close closes the cluster client and rain's node clients.
func (cl *cluster) close() error {
	errs := []error{cl.c.Close()}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, c := range cl.nodes {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// IsCluster reports whether the named shard is a Redis Cluster.
func (s *Set) IsCluster(name string) bool { return s.clusters[name] != nil }

// Primaries reads the primaries of the named cluster shard (CLUSTER
// SHARDS), sorted by node id: the units a pool's sub-pools are placed
// over. It also learns how many replicas each has (NodeReplicated).
func (s *Set) Primaries(ctx context.Context, name string) ([]Primary, error) {
	cl := s.clusters[name]
	if cl == nil {
		return nil, fmt.Errorf("shard %s is not a cluster", name)
	}
	return cl.primaries(ctx)
}

// Owner returns the address of the primary that owns key's slot in the
// named cluster shard, from the client's slot map (read once, then again
// after Reload or a redirect the client followed).
func (s *Set) Owner(ctx context.Context, name, key string) (string, error) {
	cl := s.clusters[name]
	if cl == nil {
		return "", fmt.Errorf("shard %s is not a cluster", name)
	}
	c, err := cl.c.MasterForKey(ctx, key)
	if err != nil {
		return "", fmt.Errorf("shard %s: the owner of %s: %w", name, key, err)
	}
	return c.Options().Addr, nil
}

// Node returns rain's own client of the node at addr of the named cluster
// shard: one per node, for work that must stay on one connection of one
// primary (a batch and its WAIT). Nil for a shard that is not a cluster.
func (s *Set) Node(name, addr string) *redis.Client {
	cl := s.clusters[name]
	if cl == nil {
		return nil
	}
	return cl.node(addr)
}

// NodeReplicated reports whether writes to the primary at addr of the
// named cluster shard wait for a replica: it had one (not marked failed)
// when the cluster's primaries were last read (Primaries, and rain serve's
// and settle's watch every 10 s). A primary not met in that read (a replica
// promoted since, a primary added) is taken to have one, and the primaries
// are read again in the background: a write there waits, and fails if no
// replica has it, until the read says the primary has none.
func (s *Set) NodeReplicated(name, addr string) bool {
	cl := s.clusters[name]
	if cl == nil {
		return false
	}
	cl.mu.Lock()
	n, known := cl.replicas[addr]
	cl.mu.Unlock()
	if !known {
		cl.refresh()
		return true
	}
	return n > 0
}

// refresh reads the cluster's primaries in the background, one read at a
// time.
func (cl *cluster) refresh() {
	if !cl.refreshing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer cl.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*cl.opts.Timeout)
		defer cancel()
		_, _ = cl.primaries(ctx)
	}()
}

// Reload has the named cluster shard's client read the slot map again, in
// the background (after a MOVED, or a primary that stopped answering).
func (s *Set) Reload(ctx context.Context, name string) {
	if cl := s.clusters[name]; cl != nil {
		cl.c.ReloadState(ctx)
	}
}

// Redirected has the named cluster shard's client read the slot map again
// when err is a MOVED that a write through Writer met (the map was behind
// the cluster's, nothing ran), so that the next try goes to the slot's
// owner. It returns err.
func (s *Set) Redirected(ctx context.Context, name string, err error) error {
	if err != nil && redis.HasErrorPrefix(err, "MOVED") {
		s.Reload(ctx, name)
	}
	return err
}

// AskedTo reports the node an ASK answer sends a command to: its slot is
// being moved there (or a move was left half done), and the keys it names
// have gone there. Nothing ran where it was answered; the command goes to
// that node after ASKING, on the same connection.
func AskedTo(err error) (addr string, ok bool) {
	if err == nil {
		return "", false
	}
	f := strings.Fields(err.Error())
	if len(f) != 3 || f[0] != "ASK" {
		return "", false
	}
	return RedirectAddr(f[2]), true
}

// RedirectAddr is the node's address in a MOVED or ASK answer as rain names
// nodes (net.JoinHostPort): Redis writes an IPv6 host without brackets
// ("::1:7001"), which a client cannot dial.
func RedirectAddr(a string) string {
	i := strings.LastIndexByte(a, ':')
	if i < 0 || strings.HasPrefix(a, "[") {
		return a
	}
	return net.JoinHostPort(a[:i], a[i+1:])
}

// Slot is the Redis Cluster hash slot of key: CRC16 of its hash tag (the
// part between the first '{' and the next '}', when not empty) or of the
// whole key, modulo 16384.
func Slot(key string) int {
	if i := indexByte(key, '{'); i >= 0 {
		if j := indexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % 16384)
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// Writer is where a write of key to the named shard goes when its caller
// may WAIT for a replica after it, and whether it should: the shard's
// client and whether it runs with replicas (Sentinel); on a cluster shard,
// rain's own client of the primary the slot map names the owner of key (a
// WAIT counts what its own connection wrote), and whether that primary has
// replicas. Never the cluster's client: it follows a MOVED or an ASK to
// another primary, whose replicas were not asked about, and a write there
// would go unwaited, though that primary may have replicas and fail over.
// A slot map behind the cluster's (a slot moved since it was read) makes
// the write answer MOVED, nothing run: the caller has the map read again
// (Redirected), as a claim that meets a MOVED does.
func (s *Set) Writer(ctx context.Context, name, key string) (c redis.UniversalClient, replicated bool, err error) {
	if s.clusters[name] == nil {
		return s.Client(name), s.Replicated(name), nil
	}
	addr, err := s.Owner(ctx, name, key)
	if err != nil {
		return nil, false, err
	}
	return s.Node(name, addr), s.NodeReplicated(name, addr), nil
}

// CheckClusters checks every cluster shard as rain needs it at start: it
// answers as a cluster (a standalone server given as cluster/ does not),
// and its primaries cover all 16384 slots. Unreachable seeds are reported
// as such (Unreachable), a server that is no cluster or a cluster with
// slots uncovered by ErrNotACluster.
func (s *Set) CheckClusters(ctx context.Context) error {
	var errs []error
	for _, name := range s.names {
		cl := s.clusters[name]
		if cl == nil {
			continue
		}
		ps, err := cl.primaries(ctx)
		switch {
		case err != nil && (strings.Contains(err.Error(), "cluster support disabled") || redis.HasErrorPrefix(err, "unknown command")):
			errs = append(errs, fmt.Errorf("%w: shard %s: %v (is it a Redis Cluster? a standalone server is given as host:port)", ErrNotACluster, name, err))
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		covered := int64(0)
		for _, p := range ps {
			for _, r := range p.Slots {
				covered += r[1] - r[0] + 1
			}
		}
		if covered != 16384 {
			errs = append(errs, fmt.Errorf("%w: shard %s: its primaries cover %d of the 16384 slots (run redis-cli --cluster fix)", ErrNotACluster, name, covered))
		}
	}
	return errors.Join(errs...)
}

// ErrNotACluster is returned by CheckClusters for a cluster shard that is
// no cluster, or one whose slots are not all covered.
var ErrNotACluster = errors.New("not a whole Redis Cluster")

// ClusterChange is a change in the primaries of a cluster shard, as
// WatchClusters sees it.
type ClusterChange struct {
	Shard          string
	Added, Removed []string // primaries' addresses
	Primaries      int      // how many it has now
}

// WatchClusters reads the primaries of every cluster shard every interval
// until ctx ends, and tells changed of each change in their list (a
// primary added, removed, or a replica promoted in a failover). The first
// read is the baseline: it is not a change. A read that fails is skipped.
func (s *Set) WatchClusters(ctx context.Context, every time.Duration, changed func(ClusterChange)) {
	var names []string
	for _, name := range s.names {
		if s.clusters[name] != nil {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return
	}
	known := map[string][]string{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for _, name := range names {
			rctx, cancel := context.WithTimeout(ctx, 5*s.Timeout())
			ps, err := s.clusters[name].primaries(rctx)
			cancel()
			if err != nil {
				continue
			}
			var now []string
			for _, p := range ps {
				now = append(now, p.Addr)
			}
			slices.Sort(now)
			before, seen := known[name]
			known[name] = now
			if !seen || slices.Equal(before, now) {
				continue
			}
			c := ClusterChange{Shard: name, Primaries: len(now)}
			for _, a := range now {
				if !slices.Contains(before, a) {
					c.Added = append(c.Added, a)
				}
			}
			for _, a := range before {
				if !slices.Contains(now, a) {
					c.Removed = append(c.Removed, a)
				}
			}
			changed(c)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
