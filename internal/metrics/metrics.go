// Package metrics writes rain's figures in the Prometheus text format.
// rain exposes a handful of counters and gauges, so it appends text rather
// than carry a client library.
package metrics

import "fmt"

// Metric is one unlabeled sample with its help text.
type Metric struct {
	Name string
	Kind string // "counter" or "gauge"
	Help string
	V    int64
}

// Append appends ms in the text exposition format.
func Append(b []byte, ms ...Metric) []byte {
	for _, m := range ms {
		b = fmt.Appendf(b, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", m.Name, m.Help, m.Name, m.Kind, m.Name, m.V)
	}
	return b
}
