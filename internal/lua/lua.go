// Package lua owns rain's Redis scripts (the *.lua files beside this one,
// embedded) and their typed Go wrappers. Nothing else in rain talks Lua.
//
// Most scripts work on one sub-pool and take all its keys in KEYS; the keys
// of sub-pool j of pool P are built by SubPool.Keys alone and all carry the
// hash tag {P:j}, so they would also share a Redis Cluster slot. The others
// each touch one key of their own: a pool's record (record.lua, tagged
// {P}), the serial counter and its watermark copies (serial.lua,
// watermark.lua). Scripts run with EVALSHA and fall back to EVAL on NOSCRIPT
// (go-redis Script.Run), so a restarted shard with an empty script cache
// costs one extra round trip.
//
// Every count is an integer and every amount integer cents. Lua numbers are
// doubles, exact to 2^53; rain caps a pool at 1e15 cents so sums stay exact.
//
// The files: lua.go the embedded scripts and shared helpers, keys.go the
// key schema, pool.go setting up and loading a sub-pool and the pool
// record, claim.go the claim, confirm and release of grants, spill.go the
// spill protocol's steps, audit.go the audit's reads, serial.go the serial
// scripts.
package lua

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed setup.lua
	setupSrc string
	//go:embed load.lua
	loadSrc string
	//go:embed open.lua
	openSrc string
	//go:embed claim_many.lua
	claimManySrc string
	//go:embed audit.lua
	auditSrc string
	//go:embed confirm.lua
	confirmSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed take.lua
	takeSrc string
	//go:embed adopt.lua
	adoptSrc string
	//go:embed ack.lua
	ackSrc string
	//go:embed abort.lua
	abortSrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed transfers.lua
	transfersSrc string
	//go:embed record.lua
	recordSrc string
	//go:embed serial.lua
	serialSrc string
	//go:embed watermark.lua
	watermarkSrc string
	//go:embed confirm_many.lua
	confirmManySrc string
	//go:embed end.lua
	endSrc string
	//go:embed seal.lua
	sealSrc string
	//go:embed retire.lua
	retireSrc string
	//go:embed group.lua
	groupSrc string
	//go:embed acknowledge.lua
	acknowledgeSrc string

	setupScript       = redis.NewScript(setupSrc)
	loadScript        = redis.NewScript(loadSrc)
	openScript        = redis.NewScript(openSrc)
	claimManyScript   = redis.NewScript(claimManySrc)
	auditScript       = redis.NewScript(auditSrc)
	confirmScript     = redis.NewScript(confirmSrc)
	releaseScript     = redis.NewScript(releaseSrc)
	takeScript        = redis.NewScript(takeSrc)
	adoptScript       = redis.NewScript(adoptSrc)
	ackScript         = redis.NewScript(ackSrc)
	abortScript       = redis.NewScript(abortSrc)
	decideScript      = redis.NewScript(decideSrc)
	transfersScript   = redis.NewScript(transfersSrc)
	recordScript      = redis.NewScript(recordSrc)
	serialScript      = redis.NewScript(serialSrc)
	watermarkScript   = redis.NewScript(watermarkSrc)
	confirmManyScript = redis.NewScript(confirmManySrc)
	endScript         = redis.NewScript(endSrc)
	sealScript        = redis.NewScript(sealSrc)
	retireScript      = redis.NewScript(retireSrc)
	groupScript       = redis.NewScript(groupSrc)
	acknowledgeScript = redis.NewScript(acknowledgeSrc)

	// scripts is every script, for LoadScripts and SHA.
	scripts = map[string]*redis.Script{
		"setup": setupScript, "load": loadScript, "open": openScript, "claim_many": claimManyScript,
		"audit": auditScript, "confirm": confirmScript, "release": releaseScript,
		"take": takeScript, "adopt": adoptScript, "ack": ackScript, "abort": abortScript,
		"decide": decideScript, "transfers": transfersScript, "record": recordScript,
		"serial": serialScript, "watermark": watermarkScript,
		"confirm_many": confirmManyScript, "end": endScript, "seal": sealScript,
		"retire": retireScript, "group": groupScript, "acknowledge": acknowledgeScript,
	}
)

// SHA is the SHA1 of the named script (the file name without .lua), as
// EVALSHA sends it; "" for no such script. Fault tests match commands by it.
func SHA(name string) string {
	if s := scripts[name]; s != nil {
		return s.Hash()
	}
	return ""
}

// Client is what the wrappers need of a shard: *redis.Client satisfies it.
type Client = redis.Scripter

// LoadScripts loads every script into c's script cache, so that pipelined
// EVALSHA finds them.
func LoadScripts(ctx context.Context, c Client) error {
	for name, s := range scripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("load script %s: %w", name, err)
		}
	}
	return nil
}

// IsNoScript reports whether err says the shard lacks the script.
func IsNoScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

func str(res []any, i int) string {
	if i < len(res) {
		if s, ok := res[i].(string); ok {
			return s
		}
	}
	return ""
}

func integer(res []any, i int) int64 {
	if i < len(res) {
		if n, ok := res[i].(int64); ok {
			return n
		}
	}
	return 0
}
