package deploy_test

// The Prometheus and Grafana of docker-compose.yml: their files exist, they
// scrape what the file runs, and every metric the Grafana dashboard and the
// alert rules query is one that rain serve or rain settle exports (read from
// the running binaries' /metrics).

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"rain/internal/logtest"
	"rain/internal/redistest"
	"rain/internal/wait/waittest"
)

// metricRE finds the names of rain's, Go's and the process's series in a
// PromQL expression.
var metricRE = regexp.MustCompile(`\b(?:rain|go|process)_[a-z0-9_]+\b`)

func TestComposeObservability(t *testing.T) {
	services := readCompose(t).sub("services")
	for _, name := range []string{"prometheus", "grafana"} {
		svc := services.sub(name)
		if svc == nil || !isObservability(svc) {
			t.Fatalf("docker-compose.yml has no %s service", name)
		}
		for _, v := range svc.list("volumes") {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, "./") {
				if _, err := os.Stat(fromRoot(src)); err != nil {
					t.Errorf("%s mounts %s: %v", name, src, err)
				}
			}
		}
	}

	// Prometheus scrapes every rain serve and settle of the default stack,
	// on the port each listens on, and none of a profile's (down unless its
	// profile is up: an instance down, a page).
	var prom struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &prom)
	var targets []string
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	for _, name := range services.keys {
		svc := services.sub(name)
		if !isRain(svc) {
			continue
		}
		env := svc.sub("environment")
		listen := env.str("RAIN_LISTEN")
		if m := env.str("RAIN_METRICS_LISTEN"); m != "" {
			listen = m // /metrics is there, and 404 on RAIN_LISTEN
		}
		if svc.list("command")[0] == "settle" {
			listen = env.str("RAIN_SETTLE_LISTEN")
		}
		_, port, err := net.SplitHostPort(listen)
		if err != nil {
			t.Errorf("%s listens on %q: %v", name, listen, err)
			continue
		}
		scraped := slices.ContainsFunc(targets, func(tg string) bool { return strings.HasPrefix(tg, name+":") })
		switch {
		case profile(svc) != "" && scraped:
			t.Errorf("Prometheus scrapes %s, of profile %q: it is down whenever that profile is not up", name, profile(svc))
		case profile(svc) == "" && !slices.Contains(targets, name+":"+port):
			t.Errorf("Prometheus does not scrape %s:%s (its targets: %v)", name, port, targets)
		}
	}

	// Every series the dashboard and the rules query is exported.
	exported := exportedMetrics(t)
	var exprs []string
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile("grafana/dashboards/rain.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("rain.json: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if len(prom.RuleFiles) != 1 || filepath.Base(prom.RuleFiles[0]) != "alerts.yml" {
		t.Errorf("prometheus.yml rule_files = %v, want the mounted alerts.yml", prom.RuleFiles)
	}
	readYAML(t, "prometheus/alerts.yml", &rules)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			exprs = append(exprs, r.Expr)
		}
	}
	for _, want := range []string{"RainReaperNotLeading", "RainSettlementLagging", "RainSerialRefusals", "RainShardDown"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("alerts.yml has no %s rule (it has %v)", want, alerts)
		}
	}
	checked := 0
	for _, e := range exprs {
		names := metricRE.FindAllString(e, -1)
		if len(names) == 0 && !strings.Contains(e, "up{") {
			t.Errorf("query %q names no rain series", e)
		}
		for _, n := range names {
			checked++
			if !exported[n] {
				t.Errorf("query %q names %s, which rain does not export", e, n)
			}
		}
	}
	t.Logf("%d queries, %d series names checked against %d exported", len(exprs), checked, len(exported))
}

// exportedMetrics runs rain serve (embedded shards, one pool preloaded and
// grabbed from) and rain settle (on a real redis-server) and returns the
// series names their /metrics expose, a histogram's _bucket, _sum and
// _count included.
func exportedMetrics(t *testing.T) map[string]bool {
	bin := buildRain(t)
	out := map[string]bool{}

	serveAddr := start(t, exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--admin-token", "obs"))
	base := "http://" + serveAddr
	waitOK(t, base+"/healthz")
	do(t, "POST", base+"/admin/pools", "obs", `{"pool_id":"obs","total_cents":1000,"count":10}`)
	do(t, "POST", base+"/grab", "", `{"pool_id":"obs","user_id":"u1"}`)
	scrapeNames(t, base+"/metrics", out)

	srv := redistest.Start(t, redistest.Options{AOF: true, Fsync: "always"})
	settleAddr := start(t, exec.Command(bin, "settle", "--redis", "s1=1@"+srv.Addr, "--ledger", filepath.Join(t.TempDir(), "ledger.jsonl"),
		"--listen", "127.0.0.1:0"))
	waitOK(t, "http://"+settleAddr+"/healthz")
	scrapeNames(t, "http://"+settleAddr+"/metrics", out)
	return out
}

// start runs cmd, which listens on port 0, until the test ends, and
// returns the address it logs that it serves on.
func start(t *testing.T, cmd *exec.Cmd) (addr string) {
	t.Helper()
	logs := &logtest.Buffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s logs:\n%s", cmd.Args[1], logs.String())
		}
	})
	serving := regexp.MustCompile(`msg=serving addr=(\S+)`)
	waittest.Until(t, 30*time.Second, cmd.Args[1]+" logging the address it serves on", func() bool {
		m := serving.FindStringSubmatch(logs.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

func waitOK(t *testing.T, url string) {
	t.Helper()
	waittest.Until(t, 15*time.Second, url+" answering 200", func() bool {
		r, err := http.Get(url)
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200
	})
}

func do(t *testing.T, method, url, token, body string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if r.StatusCode >= 300 {
		t.Fatalf("%s %s = %d %s", method, url, r.StatusCode, b)
	}
}

func scrapeNames(t *testing.T, url string, out map[string]bool) {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r.Body)
	if err != nil {
		t.Fatalf("%s does not parse as Prometheus text: %v", url, err)
	}
	for name, f := range families {
		out[name] = true
		if f.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[name+s] = true
			}
		}
	}
}
