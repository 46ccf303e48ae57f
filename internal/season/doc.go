// Package season holds rain's test of a season run the way it is deployed:
// the compose topology as processes on loopback (three redis-server shards
// on appendfsync always, PostgreSQL, two rain serve, one rain settle that
// lives through the whole test), pools opening, ending and closing one
// after another while each kind of process is killed (-9) and restarted,
// and, at the end, every pool's account, the grants in PostgreSQL and the
// keys left on the shards checked against what the users were told.
//
// scripts/soak.sh runs the same for longer (RAIN_SOAK=DURATION) and prints
// each process's memory and the grabs' p99 over time.
package season
