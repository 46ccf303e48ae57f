package main

import (
	"runtime"
	"runtime/debug"

	"rain/internal/metrics"
)

// version and revision are rain's version and VCS revision, set at link
// time (-ldflags "-X main.version=v1.2.3 -X main.revision=..."), as the
// Dockerfile does; empty: the module's version and the VCS revision from
// the build info, "devel" for a build from a checkout.
var version, revision string

// buildInfo is the running binary's version and VCS revision.
func buildInfo() metrics.Build {
	b := metrics.Build{Version: version, Revision: revision}
	if info, ok := debug.ReadBuildInfo(); ok {
		if b.Version == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			b.Version = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if revision == "" {
					b.Revision = s.Value
				}
			case "vcs.modified":
				if s.Value == "true" && b.Revision != "" && revision == "" {
					b.Revision += "-dirty"
				}
			}
		}
	}
	if b.Version == "" {
		b.Version = "devel"
	}
	return b
}

// versionAttrs are the attributes of a command's first log line.
func versionAttrs() []any {
	b := buildInfo()
	return []any{"version", b.Version, "revision", b.Revision, "go", runtime.Version()}
}
