package deploy_test

// This file holds what the tests of the deployment share: where the
// repository's root is, rain's flags as `rain <cmd> -h` lists them, and
// the YAML reader. The tests run in deploy/: the manifests beside them are
// read as k8s/..., prometheus/..., the files at the root (docker-compose.yml,
// the Dockerfile, go.mod) through fromRoot.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// root is the repository's root, seen from deploy/ where the tests run.
const root = ".."

// fromRoot is path, given from the repository's root (as docker-compose.yml
// names its mounts, ./deploy/...), seen from deploy/.
func fromRoot(path string) string { return filepath.Join(root, path) }

// rainHelp is what `rain <cmd> -h` says: flag names and the env var of each.
type rainHelp struct {
	flags map[string]string // flag name -> env var ("" if none)
}

func (h rainHelp) envs() []string {
	var es []string
	for _, e := range h.flags {
		if e != "" {
			es = append(es, e)
		}
	}
	slices.Sort(es)
	return es
}

var (
	helpFlagRE = regexp.MustCompile(`^\s+-{1,2}([A-Za-z0-9][A-Za-z0-9-]*)\b`)
	helpEnvRE  = regexp.MustCompile(`\[(RAIN_[A-Z0-9_]+)\]`)
)

// helpOf runs `bin cmd -h`, which prints each flag with its env var in
// brackets to stderr and exits 0.
func helpOf(t *testing.T, bin, cmd string) rainHelp {
	t.Helper()
	c := exec.Command(bin, cmd, "-h")
	var stderr strings.Builder
	c.Stderr = &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("rain %s -h: %v (want exit 0; is %q one of rain's subcommands?)\n%s", cmd, err, cmd, stderr.String())
	}
	h := rainHelp{flags: map[string]string{}}
	last := ""
	for line := range strings.SplitSeq(stderr.String(), "\n") {
		if m := helpFlagRE.FindStringSubmatch(line); m != nil {
			last = m[1]
			h.flags[last] = ""
		}
		if m := helpEnvRE.FindStringSubmatch(line); m != nil && last != "" {
			h.flags[last] = m[1]
		}
	}
	if len(h.flags) == 0 {
		t.Fatalf("rain %s -h listed no flags:\n%s", cmd, stderr.String())
	}
	return h
}

// buildRain builds cmd/rain into a temporary directory.
func buildRain(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "rain")
	build := exec.Command("go", "build", "-o", bin, "./cmd/rain")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/rain: %v\n%s", err, out)
	}
	return bin
}

// readYAML reads the YAML file at path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// keysOf is m's keys, sorted.
func keysOf[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
