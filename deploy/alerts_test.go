package deploy_test

// The alert rules are tested like code: promtool checks them and runs their
// unit tests (prometheus/alerts_test.yml: each alert fires from
// synthetic series of its fault and stays quiet when rain is healthy), each
// alert names its severity, a summary and a runbook entry that exists, and
// Prometheus sends what fires to the Alertmanager of the compose file.

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// promtoolMissing is the message when promtool cannot be found.
const promtoolMissing = "promtool not found: run scripts/test.sh, which installs it (Debian's prometheus package), or install it yourself"

// receiver is an Alertmanager receiver, as alertmanager.yml gives it.
type receiver struct {
	Name           string `yaml:"name"`
	WebhookConfigs []struct {
		URL string `yaml:"url"`
	} `yaml:"webhook_configs"`
}

func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal(promtoolMissing)
	}
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yml"},
		{"test", "rules", "prometheus/alerts_test.yml"},
		{"check", "config", "--syntax-only", "prometheus/prometheus.yml"}, // its rule file is at the container's path
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	readYAML(t, "prometheus/alerts.yml", &rules)
	runbook, err := os.ReadFile(fromRoot("docs/runbook.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, h := range regexp.MustCompile(`(?m)^## (\S+)$`).FindAllStringSubmatch(string(runbook), -1) {
		anchors[strings.ToLower(h[1])] = true
	}
	tests, err := os.ReadFile("prometheus/alerts_test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			if s := r.Labels["severity"]; s != "page" && s != "ticket" {
				t.Errorf("%s: severity %q, want page or ticket", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s has no summary", r.Alert)
			}
			url := r.Annotations["runbook_url"]
			if anchor, ok := strings.CutPrefix(url, "docs/runbook.md#"); !ok || !anchors[anchor] || anchor != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want docs/runbook.md#%s, an entry of docs/runbook.md", r.Alert, url, strings.ToLower(r.Alert))
			}
			// Each alert is shown firing by a test of its own, beside the
			// healthy test that shows every alert quiet.
			if !regexp.MustCompile(`alertname: ` + r.Alert + `\s+exp_alerts:\s+- exp_labels`).Match(tests) {
				t.Errorf("alerts_test.yml never shows %s firing", r.Alert)
			}
		}
	}
	for a := range anchors {
		if !slices.ContainsFunc(names, func(n string) bool { return strings.ToLower(n) == a }) {
			t.Errorf("docs/runbook.md has an entry %q for no alert", a)
		}
	}

	// What fires reaches someone: prometheus.yml sends it to the compose
	// file's Alertmanager, which has a receiver.
	var prom struct {
		Alerting struct {
			Alertmanagers []struct {
				StaticConfigs []struct {
					Targets []string `yaml:"targets"`
				} `yaml:"static_configs"`
			} `yaml:"alertmanagers"`
		} `yaml:"alerting"`
	}
	readYAML(t, "prometheus/prometheus.yml", &prom)
	var targets []string
	for _, am := range prom.Alerting.Alertmanagers {
		for _, sc := range am.StaticConfigs {
			targets = append(targets, sc.Targets...)
		}
	}
	services := readCompose(t).sub("services")
	if len(targets) == 0 {
		t.Fatal("prometheus.yml has no alerting block: a firing alert reaches nobody")
	}
	for _, target := range targets {
		host, _, _ := strings.Cut(target, ":")
		if svc := services.sub(host); svc == nil || !strings.HasPrefix(svc.str("image"), "prom/alertmanager:") {
			t.Errorf("prometheus.yml sends alerts to %s, which is not an Alertmanager service of docker-compose.yml", target)
		}
	}
	var am struct {
		Route struct {
			Receiver string `yaml:"receiver"`
		} `yaml:"route"`
		Receivers []receiver `yaml:"receivers"`
	}
	readYAML(t, "alertmanager/alertmanager.yml", &am)
	if !slices.ContainsFunc(am.Receivers, func(r receiver) bool { return r.Name == am.Route.Receiver && len(r.WebhookConfigs) > 0 }) {
		t.Errorf("alertmanager.yml routes to %q, which is not a receiver with a webhook", am.Route.Receiver)
	}
	for _, r := range am.Receivers {
		for _, w := range r.WebhookConfigs {
			host := strings.TrimPrefix(w.URL, "http://")
			host, _, _ = strings.Cut(host, ":")
			if svc := services.sub(host); svc == nil || !isAlertLog(svc) {
				t.Errorf("receiver %s posts to %s, which is not the compose file's alert-log", r.Name, w.URL)
			}
		}
	}
}
