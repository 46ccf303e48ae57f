// Package loadtest holds rain's load tests; README.md says how to run them.
//
//	k6/        the k6 scripts rain's users run before a campaign (rain.js, soak.js, preload.js)
//	rainload/  the Go driver that plays the same scenarios where k6 is not installed
//	baseline/  the minimal server scripts/bench.sh measures rain against
//	minimal/   its claim script, keys and stock, which the claim path's benchmarks share
//
// The package has no code of its own. Its test (k6check_test.go) checks the
// k6 scripts with node, since k6 itself may not be installed: node --check
// parses each script, and a small stand-in for k6's modules
// (k6/testdata/k6shim) plays each script against a real rain.
package loadtest
