package deploy_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestGrafanaDashboard: the provisioned dashboard works on any Prometheus
// data source and narrows to instances and pools ($datasource, $instance,
// $pool), its rates follow the scrape interval ($__rate_interval, never a
// fixed window), and each panel has one unit, its series all of one kind
// (rates, quantiles, increases or levels: never a rate and a level on one
// axis).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("grafana/dashboards/rain.json")
	if err != nil {
		t.Fatal(err)
	}
	type ds struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID          int    `json:"id"`
			Title       string `json:"title"`
			Datasource  ds     `json:"datasource"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
				Overrides []struct {
					Properties []struct {
						ID string `json:"id"`
					} `json:"properties"`
				} `json:"overrides"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr       string `json:"expr"`
				Datasource ds     `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.Type + " " + string(v.Query)
	}
	for name, want := range map[string]string{"datasource": "datasource", "instance": "label_values(", "pool": "label_values("} {
		if !strings.Contains(vars[name], want) {
			t.Errorf("template variable $%s = %q, want one (%s)", name, vars[name], want)
		}
	}
	selector := regexp.MustCompile(`\b(rain|process|go)_[a-z0-9_]+(\{[^}]*\})?`)
	window := regexp.MustCompile(`\[([^\]]+)\]`)
	for _, p := range dash.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if p.FieldConfig.Defaults.Unit == "" {
			t.Errorf("panel %q has no unit", p.Title)
		}
		for _, o := range p.FieldConfig.Overrides {
			for _, prop := range o.Properties {
				if prop.ID == "unit" {
					t.Errorf("panel %q overrides the unit of some series: one unit per panel", p.Title)
				}
			}
		}
		kinds := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: a query's data source %q, want ${datasource}", p.Title, tg.Datasource.UID)
			}
			for _, w := range window.FindAllStringSubmatch(tg.Expr, -1) {
				if w[1] != "$__rate_interval" {
					t.Errorf("panel %q: %q uses a window of [%s], want [$__rate_interval]", p.Title, tg.Expr, w[1])
				}
			}
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[2], `instance=~"$instance"`) {
					t.Errorf("panel %q: %s is not narrowed to $instance", p.Title, m[0])
				}
				if strings.HasPrefix(m[0], "rain_stock_") && !strings.Contains(m[2], `pool=~"$pool"`) {
					t.Errorf("panel %q: %s is not narrowed to $pool", p.Title, m[0])
				}
			}
			kinds[kind(tg.Expr)] = true
		}
		if len(kinds) > 1 {
			t.Errorf("panel %q mixes %v on one axis: split it", p.Title, kinds)
		}
	}
}

// kind is what a query's values are: a quantile (seconds), a rate (per
// second), an increase (a count over the window) or a level (a gauge).
func kind(expr string) string {
	switch {
	case strings.Contains(expr, "histogram_quantile("):
		return "quantile"
	case strings.Contains(expr, "increase("):
		return "increase"
	case strings.Contains(expr, "rate("):
		return "rate"
	}
	return "level"
}
