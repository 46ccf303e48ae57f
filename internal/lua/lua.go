// Package lua owns rain's Redis scripts (the *.lua files beside this one,
// embedded) and their typed Go wrappers. Nothing else in rain talks Lua.
//
// Every script is loaded with prelude.lua in front of it: the moves of a
// sub-pool's money (its counters, its stock, its grants' states, its
// transfers), each told once there, with the conservation they keep, and
// called by the scripts that move money; no script moves money on its own.
//
// Most scripts work on one sub-pool and take all its keys in KEYS; the keys
// of sub-pool j of pool P are built by rain.SubPool.Keys alone (the key
// schema is the domain's, with no Redis in it) and all carry the hash tag
// {P:j}, so they would also share a Redis Cluster slot. The others each
// touch one key of their own: a pool's record (record.lua, tagged {P}), the
// serial counter and its watermark copies (serial.lua, watermark.lua), a
// shard's due index (due_*.lua, tagged {due}). Scripts run with EVALSHA and
// fall back to EVAL on NOSCRIPT (go-redis Script.Run), so a restarted shard
// with an empty script cache costs one extra round trip.
//
// The scripts also run on the try-it mode's embedded shards (miniredis),
// whose Lua differs in one way that matters: a string.match that finds
// nothing returns no value rather than nil, so its result is put in
// parentheses (one value, nil) wherever it is passed to a function
// (tonumber((string.match(...)))); TestDueIndex runs on both.
//
// Every count is an integer and every amount integer cents. Lua numbers are
// doubles, exact to 2^53; rain caps a pool at 1e15 cents so sums stay exact.
//
// The files: prelude.lua the money moves, lua.go the embedded scripts and
// shared helpers, pool.go setting up and loading a sub-pool and the pool
// record, claim.go the claim, confirm and release of grants, spill.go the
// spill protocol's steps, audit.go the audit's reads, due.go a shard's due
// index, serial.go the serial scripts.
package lua

import (
	"context"
	"embed"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// prelude is prelude.lua, every money move of a sub-pool told once; every
// script is loaded with it in front (see script).
var prelude = source("prelude")

//go:embed *.lua
var sources embed.FS

var (
	setupScript       = script("setup")
	loadScript        = script("load")
	openScript        = script("open")
	claimManyScript   = script("claim_many")
	auditScript       = script("audit")
	confirmScript     = script("confirm")
	releaseScript     = script("release")
	takeScript        = script("take")
	adoptScript       = script("adopt")
	ackScript         = script("ack")
	abortScript       = script("abort")
	decideScript      = script("decide")
	transfersScript   = script("transfers")
	recordScript      = script("record")
	serialScript      = script("serial")
	watermarkScript   = script("watermark")
	confirmManyScript = script("confirm_many")
	endScript         = script("end")
	sealScript        = script("seal")
	retireScript      = script("retire")
	groupScript       = script("group")
	acknowledgeScript = script("acknowledge")

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

// source is the embedded file name.lua.
func source(name string) string {
	b, err := sources.ReadFile(name + ".lua")
	if err != nil {
		panic("lua: " + err.Error()) // a script named here that is not embedded: a bug of this file
	}
	return string(b)
}

// script is the script name.lua as rain runs it: the prelude, then the
// script's own text. Its SHA1, the one EVALSHA sends, is that of the
// whole. Line numbers in a script's runtime errors count the prelude's
// lines too.
func script(name string) *redis.Script {
	return redis.NewScript(prelude + source(name))
}

// SHA is the SHA1 of the named script (the file name without .lua) with
// the prelude in front, as EVALSHA sends it; "" for no such script. Fault
// tests match commands by it.
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
