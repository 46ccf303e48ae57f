package rain

import (
	"os/exec"
	"strings"
	"testing"
)

// domainDeps are the packages of this module the domain package may build
// on: pure computation, no I/O.
var domainDeps = map[string]bool{"rain/internal/split": true}

// TestImportsNoRedis: the domain package is what a pool is apart from how
// it is stored, so nothing it builds on is a Redis client or reaches the
// shards: its dependencies name no redis, and of this module's packages
// it uses only domainDeps.
func TestImportsNoRedis(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps . = %v; the test needs the go command on PATH", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.Contains(dep, "redis") || strings.HasPrefix(dep, "rain/") && !domainDeps[dep] {
			t.Errorf("package rain depends on %s; want no Redis client and no module package but %v", dep, domainDeps)
		}
	}
}
