package deploy_test

// The cluster profile of docker-compose.yml (docker compose --profile
// cluster up): six Redis Cluster nodes, a one-shot job that makes them a
// cluster of three primaries with a replica each, and a rain serve whose
// one shard is that cluster. TestComposeCluster reads the file;
// TestComposeClusterMakesACluster runs the nodes' own command lines as
// redis-server processes on loopback and the job's own script against
// them, as compose would run it (its $$ read as $), then opens the cluster
// the way rain serve does, from rain-cluster's RAIN_REDIS: the job makes a
// whole, durable cluster once, leaves it be when run again, and waits for
// it after every node restarted (docker compose down, then up).

import (
	"context"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"rain/internal/redistest"
	"rain/internal/shard"
	"rain/internal/wait/waittest"
)

// clusterProfile is the profile's name, as docker compose --profile takes it.
const clusterProfile = "cluster"

// composeCluster is the cluster profile's part of the file.
type composeCluster struct {
	services *ymap
	nodes    []string // the Redis servers, in file order
	job      string   // the one-shot service that makes the cluster
	rain     string   // the rain serve on it
	network  string   // the network they share
}

// readComposeCluster finds the cluster profile's services, failing the
// test when it lacks one.
func readComposeCluster(t *testing.T) composeCluster {
	t.Helper()
	services := readCompose(t).sub("services")
	c := composeCluster{services: services}
	for _, name := range services.keys {
		svc := services.sub(name)
		if profile(svc) != clusterProfile {
			continue
		}
		switch {
		case isShard(svc):
			c.nodes = append(c.nodes, name)
		case isRedisJob(svc) && c.job == "":
			c.job = name
		case isRain(svc) && c.rain == "" && len(svc.list("command")) > 0 && svc.list("command")[0] == "serve":
			c.rain = name
		default:
			t.Errorf("service %s of the cluster profile is neither a node, the job that makes the cluster, nor its rain serve", name)
		}
	}
	if len(c.nodes) != 6 || c.job == "" || c.rain == "" {
		t.Fatalf("the cluster profile has nodes %v, job %q, rain %q: want 6 Redis nodes (3 primaries, a replica each), a redis-cli job and a rain serve", c.nodes, c.job, c.rain)
	}
	nets := services.sub(c.rain).list("networks")
	if len(nets) != 1 {
		t.Fatalf("%s is on networks %v, want the one network of the cluster", c.rain, nets)
	}
	c.network = nets[0]
	return c
}

// flagValue is the value after name in a command line, or "".
func flagValue(cmd []string, name string) string {
	if i := slices.Index(cmd, name); i >= 0 && i+1 < len(cmd) {
		return cmd[i+1]
	}
	return ""
}

func TestComposeCluster(t *testing.T) {
	c := readComposeCluster(t)
	compose := readCompose(t)
	netDef := compose.sub("networks").sub(c.network)
	var subnet netip.Prefix
	if cfg := netDef.sub("ipam").maps("config"); len(cfg) == 1 {
		subnet, _ = netip.ParsePrefix(interpolate(cfg[0].str("subnet")))
	}
	if !subnet.IsValid() {
		t.Fatalf("network %s: want ipam config with one subnet (the nodes' fixed addresses are in it)", c.network)
	}

	image := ""
	ips := map[netip.Addr]string{}
	for _, name := range c.nodes {
		svc := c.services.sub(name)
		cmd := svc.list("command")
		for _, want := range [][2]string{{"--cluster-enabled", "yes"}, {"--appendonly", "yes"}, {"--appendfsync", "always"}} {
			if v := flagValue(cmd, want[0]); v != want[1] {
				t.Errorf("%s: command %q: want %s %s", name, cmd, want[0], want[1])
			}
		}
		// rain matches the primaries that CLUSTER SHARDS lists, by their ip,
		// with the client's slot map, which holds each node's preferred
		// endpoint: the two agree only while it is the ip.
		if v := flagValue(cmd, "--cluster-preferred-endpoint-type"); v != "" && v != "ip" {
			t.Errorf("%s: --cluster-preferred-endpoint-type %s: rain finds a primary by the ip CLUSTER SHARDS gives", name, v)
		}
		if image == "" {
			image = svc.str("image")
		} else if svc.str("image") != image {
			t.Errorf("%s runs %s, the other nodes %s", name, svc.str("image"), image)
		}
		// A node knows its peers by IP (nodes.conf, on its volume): fixed
		// ones keep the cluster whole when compose makes the containers anew.
		ip, err := netip.ParseAddr(interpolate(svc.sub("networks").sub(c.network).str("ipv4_address")))
		switch {
		case err != nil:
			t.Errorf("%s: no fixed ipv4_address on network %s (%v)", name, c.network, err)
		case !subnet.Contains(ip):
			t.Errorf("%s: ipv4_address %s is not in %s's subnet %s", name, ip, c.network, subnet)
		case ips[ip] != "":
			t.Errorf("%s and %s both have %s", ips[ip], name, ip)
		default:
			ips[ip] = name
		}
	}

	job := c.services.sub(c.job)
	if job.str("image") != image {
		t.Errorf("%s runs %s, the nodes %s: the redis-cli of the nodes' release", c.job, job.str("image"), image)
	}
	script := jobScript(t, job)
	for _, want := range []string{"redis-cli --cluster create", "--cluster-replicas 1", "--cluster-yes", "redis-cli --cluster check"} {
		if !strings.Contains(script, want) {
			t.Errorf("%s's script lacks %q", c.job, want)
		}
	}
	for _, node := range c.nodes {
		if !strings.Contains(script, node+":6379") {
			t.Errorf("%s's script does not name %s:6379", c.job, node)
		}
		if job.sub("depends_on").sub(node).str("condition") != "service_healthy" {
			t.Errorf("%s: want depends_on %s with condition service_healthy", c.job, node)
		}
	}
	if !slices.Equal(job.list("networks"), []string{c.network}) {
		t.Errorf("%s is on networks %v, want [%s]", c.job, job.list("networks"), c.network)
	}
	if r := job.str("restart"); r != "" && r != "no" {
		t.Errorf("%s: restart %s: it runs once", c.job, r)
	}

	// rain-cluster's one shard is the cluster, every node a seed (any one
	// that answers gives the client the slot map); it starts once the job
	// made the cluster. TestComposeMatchesRain checks the rest of it as of
	// every rain serve.
	rain := c.services.sub(c.rain)
	specs, err := shard.ParseSpecs(interpolate(rain.sub("environment").str("RAIN_REDIS")))
	if err != nil {
		t.Fatalf("%s: RAIN_REDIS: %v", c.rain, err)
	}
	if len(specs) != 1 {
		t.Fatalf("%s: RAIN_REDIS names %d shards, want 1, the cluster", c.rain, len(specs))
	}
	cl, ok := specs[0].Cluster()
	if !ok || !strings.HasPrefix(specs[0].Addr, "cluster/") {
		t.Fatalf("%s: RAIN_REDIS shard %s is not of the cluster/ form", c.rain, specs[0])
	}
	var want []string
	for _, node := range c.nodes {
		want = append(want, node+":6379")
	}
	if got := slices.Sorted(slices.Values(cl.Seeds)); !slices.Equal(got, want) {
		t.Errorf("%s: RAIN_REDIS seeds %v, want every node %v", c.rain, got, want)
	}
	if rain.sub("depends_on").sub(c.job).str("condition") != "service_completed_successfully" {
		t.Errorf("%s: want depends_on %s with condition service_completed_successfully (rain refuses a cluster whose slots are not all covered)", c.rain, c.job)
	}

	// The default stack (docker compose up, no profile) is as it was:
	// none of its services is on the cluster's network or names a service
	// of a profile, and every profile service is in the cluster profile.
	for _, name := range c.services.keys {
		svc := c.services.sub(name)
		if profile(svc) != "" {
			if profile(svc) != clusterProfile {
				t.Errorf("service %s is in profiles %q: this file has the cluster profile only", name, profile(svc))
			}
			continue
		}
		nets := svc.list("networks")
		if m := svc.sub("networks"); m != nil {
			nets = m.keys
		}
		if slices.Contains(nets, c.network) {
			t.Errorf("service %s of the default stack is on the cluster's network %s", name, c.network)
		}
		var refs []string
		if d := svc.sub("depends_on"); d != nil {
			refs = append(refs, d.keys...)
		}
		refs = append(refs, svc.list("depends_on")...)
		refs = append(refs, svc.sub("environment").keysAndValues()...)
		for _, ref := range refs {
			for _, other := range c.services.keys {
				if profile(c.services.sub(other)) != "" && strings.Contains(ref, other) {
					t.Errorf("service %s of the default stack names %s, of the cluster profile (in %q)", name, other, ref)
				}
			}
		}
	}
}

// keysAndValues is a mapping's keys and scalar values, interpolated.
func (m *ymap) keysAndValues() []string {
	if m == nil {
		return nil
	}
	var out []string
	for _, k := range m.keys {
		out = append(out, k, interpolate(m.str(k)))
	}
	return out
}

// jobScript is the shell script of a service run as sh -c SCRIPT, as
// compose hands it to the shell.
func jobScript(t *testing.T, svc *ymap) string {
	t.Helper()
	cmd := svc.list("command")
	if len(cmd) != 3 || cmd[0] != "sh" || cmd[1] != "-c" {
		t.Fatalf("command %q: want sh -c SCRIPT", cmd)
	}
	return interpolate(cmd[2])
}

func TestComposeClusterMakesACluster(t *testing.T) {
	c := readComposeCluster(t)
	// The nodes, each run with its service's command line (less
	// redis-server) on a port and in a directory of its own.
	var servers []*redistest.Server
	var names []string
	for _, name := range c.nodes {
		args := c.services.sub(name).list("command")[1:]
		servers = append(servers, redistest.Start(t, redistest.Options{Cluster: true, Args: args}))
		names = append(names, name+":6379", servers[len(servers)-1].Addr)
	}
	where := strings.NewReplacer(names...)
	script := where.Replace(jobScript(t, c.services.sub(c.job)))
	if strings.Contains(script, ":6379") {
		t.Fatalf("the job's script names a node that is not one of the cluster profile's:\n%s", script)
	}
	runJob := func(what string) string {
		t.Helper()
		// Bounded like any command; the script gives up on its own after 60s.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %s: %v\n%s", what, c.job, err, out)
		}
		return string(out)
	}

	out := runJob("first run")
	if !strings.Contains(out, "Performing hash slots allocation") {
		t.Fatalf("first run: %s made no cluster:\n%s", c.job, out)
	}
	spec := where.Replace(interpolate(c.services.sub(c.rain).sub("environment").str("RAIN_REDIS")))
	ids := checkRainCluster(t, spec)

	out = runJob("second run")
	if strings.Contains(out, "Performing hash slots allocation") {
		t.Errorf("second run: %s made a cluster again:\n%s", c.job, out)
	}
	if again := checkRainCluster(t, spec); !slices.Equal(again, ids) {
		t.Errorf("after the second run the primaries are %v, want %v as before", again, ids)
	}

	// docker compose down, then up: every node stops and comes back with
	// its nodes.conf and AOF, and the job runs again.
	for _, s := range servers {
		s.Kill()
	}
	for _, s := range servers {
		s.Restart()
	}
	out = runJob("run after a restart")
	if strings.Contains(out, "Performing hash slots allocation") {
		t.Errorf("run after a restart: %s made a cluster again:\n%s", c.job, out)
	}
	checkRainCluster(t, spec)
}

// checkRainCluster opens the shard of spec as rain serve does and checks
// what rain serve checks at start (a whole cluster, every primary durable),
// then waits for three primaries with a replica each; it returns the
// primaries' node ids.
func checkRainCluster(t *testing.T, spec string) []string {
	t.Helper()
	specs, err := shard.ParseSpecs(spec)
	if err != nil {
		t.Fatalf("RAIN_REDIS %q: %v", spec, err)
	}
	set, err := shard.Open(specs, 0, shard.Options{})
	if err != nil {
		t.Fatalf("shard.Open(%s): %v", spec, err)
	}
	defer set.Close()
	ctx := context.Background()
	if err := set.CheckClusters(ctx); err != nil {
		t.Fatalf("rain would refuse the cluster: %v", err)
	}
	for _, d := range set.Durability(ctx) {
		if !d.Durable() {
			t.Errorf("rain would refuse the cluster: %s", d)
		}
	}
	var ps []shard.Primary
	waittest.Until(t, 30*time.Second, "3 primaries, each with a replica online", func() bool {
		ps, err = set.Primaries(ctx, specs[0].Name)
		return err == nil && len(ps) == 3 && !slices.ContainsFunc(ps, func(p shard.Primary) bool { return p.Replicas != 1 })
	})
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.ID)
	}
	return ids
}
