package deploy_test

// This file keeps docker-compose.yml, the Dockerfile and .dockerignore in
// step with the code, so that the stack cannot drift from the binary it runs:
//
//   - every rain service's subcommand, --flags and RAIN_* variables exist in
//     that subcommand's -h (built from cmd/rain here), and the values parse
//     the way rain parses them (RAIN_REDIS with rain's own shard.ParseSpecs);
//   - RAIN_REDIS names the Redis services of the file, every rain instance
//     names the same shards with the same weights and serial shard (the ring
//     places pools by name and weight), and waits for those shards' health;
//   - each Redis shard runs with AOF, appendfsync always (rain serve refuses
//     less), a named volume and a health check;
//   - the services of a profile (docker compose --profile NAME up) use only
//     that profile's shards, and nothing of the default stack uses theirs:
//     the cluster profile's own checks are in compose_cluster_test.go;
//   - the Dockerfile builds with the Go of go.mod, statically, and runs
//     /rain as a non-root user on an image that has the wget the health check
//     calls.
//
// The file is read with go.yaml.in/yaml/v3 into a small ordered mapping type.
// Compose interpolates ${VAR:-default} and $VAR, and reads $$ as a $: the
// tests see the file as compose would with nothing set in the environment.

import (
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"rain/internal/shard"

	"go.yaml.in/yaml/v3"
)

// ------------------------------------------------------------ YAML subset

// ymap is a YAML block mapping, its keys in file order. A value is a string,
// a []string (block or flow list of scalars), a []*ymap (a list of
// mappings), a *ymap, or nil (no value).
type ymap struct {
	keys []string
	vals map[string]any
}

func (m *ymap) get(key string) any {
	if m == nil {
		return nil
	}
	return m.vals[key]
}

func (m *ymap) str(key string) string {
	s, _ := m.get(key).(string)
	return s
}

func (m *ymap) list(key string) []string {
	l, _ := m.get(key).([]string)
	return l
}

func (m *ymap) sub(key string) *ymap {
	s, _ := m.get(key).(*ymap)
	return s
}

func (m *ymap) maps(key string) []*ymap {
	l, _ := m.get(key).([]*ymap)
	return l
}

// toYmap turns a YAML node into the values above: mappings into *ymap (keys
// in file order, merge keys and aliases resolved by the YAML library),
// sequences of scalars into []string, sequences of mappings into []*ymap,
// scalars into strings, null into nil.
func toYmap(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		return toYmap(n.Content[0])
	case yaml.AliasNode:
		return toYmap(n.Alias)
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		if len(n.Content) > 0 && n.Content[0].Kind == yaml.MappingNode {
			out := make([]*ymap, 0, len(n.Content))
			for _, c := range n.Content {
				v, err := toYmap(c)
				m, ok := v.(*ymap)
				if err != nil || !ok {
					return nil, fmt.Errorf("line %d: a list of mappings holds %v (%v)", c.Line, v, err)
				}
				out = append(out, m)
			}
			return out, nil
		}
		out := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			v, err := toYmap(c)
			s, ok := v.(string)
			if err != nil || !ok {
				return nil, fmt.Errorf("line %d: a list of scalars holds %v", c.Line, v)
			}
			out = append(out, s)
		}
		return out, nil
	case yaml.MappingNode:
		m := &ymap{vals: map[string]any{}}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				return nil, fmt.Errorf("line %d: merge keys are not read", k.Line)
			}
			val, err := toYmap(v)
			if err != nil {
				return nil, err
			}
			if _, dup := m.vals[k.Value]; dup {
				return nil, fmt.Errorf("line %d: key %q repeated", k.Line, k.Value)
			}
			m.keys = append(m.keys, k.Value)
			m.vals[k.Value] = val
		}
		return m, nil
	}
	return nil, fmt.Errorf("line %d: unexpected YAML node kind %v", n.Line, n.Kind)
}

// interpolate resolves compose's ${VAR:-default}, ${VAR-default}, ${VAR} and
// $VAR to their defaults (or ""), as with nothing set in the environment: the
// file must work as written. ${VAR:?message}, a variable compose refuses to
// start without, becomes required(VAR). $$ is compose's escape of a $.
func interpolate(s string) string {
	re := regexp.MustCompile(`\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*)|:?\?([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)`)
	return re.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		sub := re.FindStringSubmatch(m)
		if strings.HasPrefix(m, "${"+sub[1]+":?") || strings.HasPrefix(m, "${"+sub[1]+"?") {
			return required(sub[1])
		}
		return sub[2]
	})
}

// required is what interpolate makes of a variable compose requires.
func required(name string) string { return "required(" + name + ")" }

// ------------------------------------------------------------ the stack

func readCompose(t *testing.T) *ymap {
	t.Helper()
	b, err := os.ReadFile(fromRoot("docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	v, err := toYmap(&doc)
	m, ok := v.(*ymap)
	if err != nil || !ok {
		t.Fatalf("docker-compose.yml: %v (top level %T, want a mapping)", err, v)
	}
	return m
}

// isShard says whether a service is a Redis server (a shard, or a node of
// a cluster shard); isRedisJob whether it runs the Redis image for a tool
// (redis-cli: the cluster profile's redis-cluster-create); isRain whether it
// runs the rain image built from this repository.
func isShard(svc *ymap) bool {
	cmd := svc.list("command")
	return strings.HasPrefix(svc.str("image"), "redis:") && len(cmd) > 0 && cmd[0] == "redis-server"
}
func isRedisJob(svc *ymap) bool {
	return strings.HasPrefix(svc.str("image"), "redis:") && !isShard(svc)
}
func isRain(svc *ymap) bool { return strings.HasPrefix(svc.str("image"), "rain:") }

// profile names the compose profiles a service is in, "" for none: the
// default stack, which docker compose up starts, and --profile NAME adds to.
func profile(svc *ymap) string { return strings.Join(svc.list("profiles"), ",") }

// isDatabase says whether a service is the PostgreSQL of the file.
func isDatabase(svc *ymap) bool { return strings.HasPrefix(svc.str("image"), "postgres:") }

// isObservability says whether a service is the Prometheus, Grafana or
// Alertmanager of the file, or Alertmanager's webhook (checked by
// TestComposeObservability and TestAlertRules).
func isObservability(svc *ymap) bool {
	img := svc.str("image")
	return strings.HasPrefix(img, "prom/prometheus:") || strings.HasPrefix(img, "grafana/grafana:") ||
		strings.HasPrefix(img, "prom/alertmanager:") || isAlertLog(svc)
}

// isAlertLog says whether a service is the webhook that prints what
// Alertmanager notifies (checked by TestAlertRules).
func isAlertLog(svc *ymap) bool { return strings.HasPrefix(svc.str("image"), "python:") }

func TestComposeMatchesRain(t *testing.T) {
	compose := readCompose(t)
	services := compose.sub("services")
	if services == nil {
		t.Fatal("docker-compose.yml has no services")
	}
	bin := buildRain(t)
	helps := map[string]rainHelp{}

	type instance struct {
		name, profile string
		specs         []shard.Spec
		serial        string
	}
	var serves []instance
	usedShards := map[string]bool{}

	for _, name := range services.keys {
		svc := services.sub(name)
		switch {
		case svc == nil, isShard(svc), isRedisJob(svc), isObservability(svc), isDatabase(svc):
			continue
		case !isRain(svc):
			t.Errorf("service %s is neither a Redis shard (image redis:...) nor rain (image rain:...): teach deploy/compose_test.go about it", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			cmd := svc.list("command")
			if len(cmd) == 0 {
				t.Fatalf("no command: say which rain subcommand it runs")
			}
			sub := cmd[0]
			h, ok := helps[sub]
			if !ok {
				h = helpOf(t, bin, sub)
				helps[sub] = h
			}
			for _, arg := range cmd[1:] {
				if !strings.HasPrefix(arg, "-") {
					continue
				}
				flag, _, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
				if _, ok := h.flags[flag]; !ok {
					t.Errorf("command flag %s: rain %s has no --%s (its flags: %v)", arg, sub, flag, keysOf(h.flags))
				}
			}
			envs := svc.sub("environment")
			if envs == nil {
				t.Fatal("no environment mapping")
			}
			env := map[string]string{}
			for _, k := range envs.keys {
				env[k] = interpolate(envs.str(k))
				if strings.HasPrefix(k, "RAIN_") && !slices.Contains(h.envs(), k) {
					t.Errorf("environment %s: rain %s reads no such variable (it reads %v)", k, sub, h.envs())
				}
			}

			specs, err := shard.ParseSpecs(env["RAIN_REDIS"])
			if err != nil {
				t.Fatalf("RAIN_REDIS=%q: %v", env["RAIN_REDIS"], err)
			}
			deps := svc.sub("depends_on")
			for _, sp := range specs {
				addrs := []string{sp.Addr}
				if cl, ok := sp.Cluster(); ok {
					addrs = cl.Seeds // each a node of the cluster
				}
				for _, addr := range addrs {
					host, port, _ := net.SplitHostPort(addr)
					target := services.sub(host)
					switch {
					case target == nil:
						t.Errorf("RAIN_REDIS shard %s points at %s: no service %q in the file", sp.Name, addr, host)
					case !isShard(target):
						t.Errorf("RAIN_REDIS shard %s points at %s, which is not a Redis service", sp.Name, host)
					case port != "6379":
						t.Errorf("RAIN_REDIS shard %s: port %s, but the Redis services listen on 6379", sp.Name, port)
					case profile(target) != profile(svc):
						t.Errorf("RAIN_REDIS shard %s points at %s, of profile %q, from a service of profile %q: a profile's rain uses its own shards", sp.Name, host, profile(target), profile(svc))
					}
					usedShards[host] = true
					if deps.sub(host).str("condition") != "service_healthy" {
						t.Errorf("depends_on: want %s with condition service_healthy (rain serves only when every shard answers)", host)
					}
				}
			}
			for _, dep := range deps.keys {
				if d := services.sub(dep); d != nil && profile(d) != "" && profile(d) != profile(svc) {
					t.Errorf("depends_on %s, of profile %q, from a service of profile %q", dep, profile(d), profile(svc))
				}
			}
			if v := env["RAIN_POSTGRES"]; v != "" {
				u, err := url.Parse(v)
				switch {
				case err != nil || u.Scheme != "postgres":
					t.Errorf("RAIN_POSTGRES=%q: want a postgres:// URL", v)
				case services.sub(u.Hostname()) == nil || !isDatabase(services.sub(u.Hostname())):
					t.Errorf("RAIN_POSTGRES points at %s, which is not a PostgreSQL service of the file", u.Hostname())
				case deps.sub(u.Hostname()).str("condition") != "service_healthy":
					t.Errorf("depends_on: want %s with condition service_healthy (rain applies its schema at start)", u.Hostname())
				}
			}
			serial := env["RAIN_SERIAL_SHARD"]
			if serial == "" {
				serial = specs[0].Name
			} else if !slices.ContainsFunc(specs, func(s shard.Spec) bool { return s.Name == serial }) {
				t.Errorf("RAIN_SERIAL_SHARD=%s is not one of RAIN_REDIS's shards", serial)
			}
			if v, ok := env["RAIN_LOG_LEVEL"]; ok {
				var l slog.Level
				if err := l.UnmarshalText([]byte(v)); err != nil {
					t.Errorf("RAIN_LOG_LEVEL=%s: %v", v, err)
				}
			}
			if sub != "serve" {
				return
			}
			serves = append(serves, instance{name, profile(svc), specs, serial})
			checkServe(t, svc, env)
		})
	}

	// Every instance of one stack (the default one, or a profile's) must
	// place pools the same way and draw serials from the same counter: same
	// shard names and weights (addresses may differ), same serial shard.
	ring := func(ss []shard.Spec) []string {
		var r []string
		for _, s := range ss {
			r = append(r, fmt.Sprintf("%s=%d", s.Name, s.Weight))
		}
		slices.Sort(r)
		return r
	}
	first := map[string]instance{}
	defaults := 0
	for _, in := range serves {
		if in.profile == "" {
			defaults++
		}
		f, ok := first[in.profile]
		if !ok {
			first[in.profile] = in
			continue
		}
		if a, b := ring(f.specs), ring(in.specs); !slices.Equal(a, b) || f.serial != in.serial {
			t.Errorf("%s and %s disagree: shards %v vs %v, serial shard %s vs %s",
				f.name, in.name, a, b, f.serial, in.serial)
		}
	}
	if defaults < 2 {
		t.Errorf("%d rain serve instances in the default stack, want at least 2", defaults)
	}
	for _, name := range services.keys {
		if isShard(services.sub(name)) && !usedShards[name] {
			t.Errorf("Redis service %s is in no rain instance's RAIN_REDIS", name)
		}
	}
}

// checkServe checks what `rain serve` needs in a container: an admin token
// (required with --redis), a word on user auth (a key, or none on purpose:
// without one, rain serve warns that any client grabs as anyone), a listen address reachable through the
// published port, the metrics on a listener of their own that is not
// published, ports on 127.0.0.1 only, a /readyz health check on that port,
// and a stop grace period longer than rain's own shutdown timeout.
func checkServe(t *testing.T, svc *ymap, env map[string]string) {
	// The admin token comes from a compose secret, never from the file or
	// the environment (where every process and `docker inspect` sees it).
	if tok, ok := env["RAIN_ADMIN_TOKEN"]; ok {
		t.Errorf("RAIN_ADMIN_TOKEN=%q in the environment: give the token as a secret file (RAIN_ADMIN_TOKEN_FILE)", tok)
	}
	file, ok := strings.CutPrefix(env["RAIN_ADMIN_TOKEN_FILE"], "/run/secrets/")
	if !ok || !slices.Contains(svc.list("secrets"), file) {
		t.Errorf("RAIN_ADMIN_TOKEN_FILE=%q, secrets %v: want /run/secrets/NAME with NAME among the service's secrets", env["RAIN_ADMIN_TOKEN_FILE"], svc.list("secrets"))
	}
	if env["RAIN_USER_AUTH"] == "" {
		t.Error("no RAIN_USER_AUTH: rain serve on real shards then trusts the body's user_id and warns of it (give a key, or none on purpose)")
	}
	host, port, err := net.SplitHostPort(env["RAIN_LISTEN"])
	if err != nil {
		t.Fatalf("RAIN_LISTEN=%q: %v", env["RAIN_LISTEN"], err)
	}
	_, metricsPort, err := net.SplitHostPort(env["RAIN_METRICS_LISTEN"])
	if err != nil || metricsPort == port {
		t.Errorf("RAIN_METRICS_LISTEN=%q: want /metrics on a listener of its own (the stock off the clients' port)", env["RAIN_METRICS_LISTEN"])
	}
	if host != "0.0.0.0" && host != "" {
		t.Errorf("RAIN_LISTEN=%s: listen on 0.0.0.0 in a container, or the published port reaches nothing", env["RAIN_LISTEN"])
	}
	ports := svc.list("ports")
	if len(ports) == 0 {
		t.Error("no ports published")
	}
	for _, p := range ports {
		parts := strings.Split(p, ":")
		if len(parts) != 3 || parts[0] != "127.0.0.1" || parts[2] != port {
			t.Errorf("port %q: want 127.0.0.1:HOST:%s (load only ever targets 127.0.0.1)", p, port)
		}
	}
	test := strings.Join(svc.sub("healthcheck").list("test"), " ")
	if !strings.Contains(test, "http://127.0.0.1:"+port+"/readyz") {
		t.Errorf("healthcheck %q: want GET http://127.0.0.1:%s/readyz", test, port)
	}
	if strings.Contains(test, "wget") && !runtimeHasWget(t) {
		t.Error("the healthcheck calls wget, but the Dockerfile's runtime image is neither alpine nor busybox")
	}
	// On SIGTERM rain drains (readyz 503) for RAIN_DRAIN_DELAY (5s on real
	// shards), then lets grabs finish for up to RAIN_SHUTDOWN_TIMEOUT (10s):
	// the grace period must cover both.
	durations := map[string]time.Duration{"RAIN_SHUTDOWN_TIMEOUT": 10 * time.Second, "RAIN_DRAIN_DELAY": 5 * time.Second}
	for k := range durations {
		if v, ok := env[k]; ok {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("%s=%s: %v", k, v, err)
			}
			durations[k] = d
		}
	}
	stop := durations["RAIN_SHUTDOWN_TIMEOUT"] + durations["RAIN_DRAIN_DELAY"]
	grace, err := time.ParseDuration(svc.str("stop_grace_period"))
	if err != nil || grace <= stop {
		t.Errorf("stop_grace_period %q: want longer than the drain delay and the shutdown timeout (%v), so grabs finish before SIGKILL", svc.str("stop_grace_period"), stop)
	}
}

func TestComposeShards(t *testing.T) {
	compose := readCompose(t)
	services := compose.sub("services")
	volumes := compose.sub("volumes")
	n := 0
	for _, name := range services.keys {
		svc := services.sub(name)
		if !isShard(svc) {
			continue
		}
		n++
		t.Run(name, func(t *testing.T) {
			cmd := svc.list("command")
			for _, want := range [][2]string{{"--appendonly", "yes"}, {"--appendfsync", "always"}} {
				i := slices.Index(cmd, want[0])
				if i < 0 || i+1 >= len(cmd) || cmd[i+1] != want[1] {
					t.Errorf("command %q: want %s %s (a grant answered is fsynced: rain serve refuses anything less)", cmd, want[0], want[1])
				}
			}
			if test := strings.Join(svc.sub("healthcheck").list("test"), " "); !strings.Contains(test, "redis-cli ping") {
				t.Errorf("healthcheck %q: want redis-cli ping", test)
			}
			data := ""
			for _, v := range svc.list("volumes") {
				if src, dst, _ := strings.Cut(v, ":"); dst == "/data" {
					data = src
				}
			}
			if data == "" || volumes == nil || !slices.Contains(volumes.keys, data) {
				t.Errorf("volumes %q: want a named volume (declared under volumes:) on /data", svc.list("volumes"))
			}
		})
	}
	if n < 2 {
		t.Errorf("%d Redis shards, want several", n)
	}
}

// --------------------------------------------------------------- Dockerfile

// dockerStages reads the Dockerfile into stages: each a FROM line and the
// instructions after it, continuation lines joined.
func dockerStages(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(fromRoot("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string
	var cur strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		ins := cur.String()
		cur.Reset()
		if strings.HasPrefix(strings.ToUpper(ins), "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile: %q before the first FROM", ins)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], ins)
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages, want a build stage and a small runtime stage", len(stages))
	}
	return stages
}

// fromImage is the image of a FROM instruction, without --platform.
func fromImage(from string) string {
	for _, f := range strings.Fields(from)[1:] {
		if !strings.HasPrefix(f, "--") {
			return f
		}
	}
	return ""
}

func runtimeHasWget(t *testing.T) bool {
	stages := dockerStages(t)
	img := fromImage(stages[len(stages)-1][0])
	return strings.HasPrefix(img, "alpine:") || strings.HasPrefix(img, "busybox:")
}

func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	mod, err := os.ReadFile(fromRoot("go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	goVersion := string(m[1])

	build := strings.Join(stages[0], "\n")
	if img := fromImage(stages[0][0]); !strings.HasPrefix(img, "golang:"+goVersion) {
		t.Errorf("build stage FROM %s: want golang:%s (go.mod says go %s)", img, goVersion, goVersion)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}"`,
		"ARG VERSION", "ARG REVISION", "-o /rain ./cmd/rain"} {
		if !strings.Contains(build, want) {
			t.Errorf("build stage lacks %s", want)
		}
	}

	final := stages[len(stages)-1]
	runtime := strings.Join(final, "\n")
	for _, want := range []string{`org.opencontainers.image.version="${VERSION}"`, `org.opencontainers.image.revision="${REVISION}"`,
		"org.opencontainers.image.title=", "ARG VERSION", "ARG REVISION"} {
		if !strings.Contains(runtime, want) {
			t.Errorf("runtime stage lacks %s (the image's OCI labels)", want)
		}
	}
	if !slices.Contains(final, `ENTRYPOINT ["/rain"]`) {
		t.Errorf(`runtime stage lacks ENTRYPOINT ["/rain"]: %q`, final)
	}
	user := ""
	for _, ins := range final {
		if u, ok := strings.CutPrefix(ins, "USER "); ok {
			user = strings.TrimSpace(u)
		}
	}
	if name, _, _ := strings.Cut(user, ":"); name == "" || name == "root" || name == "0" {
		t.Errorf("runtime stage runs as %q, want a non-root USER", user)
	}
	// rain serve without --redis is the try-it mode: the image must not
	// make it listen on every interface (docker run -p would publish it).
	for _, ins := range final {
		if strings.HasPrefix(strings.ToUpper(ins), "ENV ") && regexp.MustCompile(`RAIN_LISTEN[= ]+"?(0\.0\.0\.0|\[::\]|:)`).MatchString(ins) {
			t.Errorf("runtime stage %q: the try-it mode would listen on every interface; let deployments set RAIN_LISTEN", ins)
		}
	}
}

func TestDockerignore(t *testing.T) {
	b, err := os.ReadFile(fromRoot(".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			patterns = append(patterns, strings.TrimPrefix(line, "/"))
		}
	}
	excluded := func(path string) bool {
		for _, p := range patterns {
			p = strings.TrimSuffix(p, "/")
			if ok, _ := filepath.Match(p, path); ok || strings.HasPrefix(path, p+"/") {
				return true
			}
		}
		return false
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd/rain/main.go", "internal/api/api.go"} {
		if excluded(need) {
			t.Errorf(".dockerignore excludes %s, which the build needs", need)
		}
	}
	for _, out := range []string{".git", "bench-out", "rain"} {
		if !excluded(out) {
			t.Errorf(".dockerignore lets %s into the build context", out)
		}
	}
}

// TestComposeImages: one build of the rain image, stamped with its version
// and revision, run by every rain service; every other image pinned to a
// release (no latest, no bare major version); the admin token a secret file
// that git ignores.
func TestComposeImages(t *testing.T) {
	compose := readCompose(t)
	services := compose.sub("services")
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:v?\d+\.\d+[0-9A-Za-z.+-]*$`)
	builds := 0
	for _, name := range services.keys {
		svc := services.sub(name)
		img := svc.str("image")
		if isRain(svc) {
			if b := svc.sub("build"); b != nil {
				builds++
				args := b.sub("args")
				if b.str("context") != "." || args == nil || args.str("VERSION") == "" || args.str("REVISION") == "" {
					t.Errorf("%s builds with %v: want context . and the VERSION and REVISION build args", name, b.keys)
				}
			} else if svc.str("pull_policy") != "never" {
				t.Errorf("%s runs %s without building it: want pull_policy never (the image the build made)", name, img)
			}
			continue
		}
		if !pinned.MatchString(img) {
			t.Errorf("%s: image %q is not pinned to a release", name, img)
		}
	}
	if builds != 1 {
		t.Errorf("%d services build the rain image, want one (the others run it)", builds)
	}
	sec := compose.sub("secrets")
	if sec == nil || sec.sub("admin_token") == nil {
		t.Fatal("docker-compose.yml declares no admin_token secret")
	}
	file := sec.sub("admin_token").str("file")
	ignore, err := os.ReadFile(fromRoot(".gitignore"))
	if err != nil {
		t.Fatal(err)
	}
	dir := "/" + strings.TrimPrefix(filepath.Dir(file), "./") + "/"
	if !strings.Contains(string(ignore), dir) {
		t.Errorf("the admin token's file %s: .gitignore does not ignore %s", file, dir)
	}
}
