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
// with an empty script cache costs one extra round trip. The grab's
// script, claim_many, runs as the function of a library (FCALL; see
// claimLibrary), where the prelude is defined once, not on every call.
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
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strings"

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

// The grab's script, claim_many, runs as a function of a library of
// rain's (FCALL) on Redis, where the prelude's definitions are made once,
// when the library is loaded, instead of on every call as a script's are
// (about a tenth of a call's time: docs/benchmarks.md, "claim_many as a
// function"). The library is the prelude's definitions, then claim_many's
// function: the prelude's lines from its "Every script begins here" on,
// then claim_many.lua, with KEYS and ARGV the call's. Its name and the
// function's carry the first 16 hex digits of the SHA1 of its text, so
// that two releases of rain running at once (a rolling upgrade) each call
// their own claim_many, as EVALSHA's SHAs keep them apart. A server without
// functions (the try-it mode's embedded shards) runs claim_many as the
// script claimManyScript (Form.Script).
var claimLibrary, claimFunction = library("claim_many")

// preludeEntry opens the lines of the prelude that every script runs
// first; the lines before it only define.
const preludeEntry = "-- Every script begins here"

// library is the function library of the script name.lua, and the name of
// its one function.
func library(name string) (code, function string) {
	defs, entry, ok := strings.Cut(prelude, preludeEntry)
	if !ok {
		panic("lua: prelude.lua has no line " + preludeEntry) // a bug of prelude.lua
	}
	const tag = "@@"
	code = "#!lua name=rain_" + tag + "\n" +
		"local KEYS, ARGV -- the call's, set by the function below\n" +
		defs +
		"redis.register_function('" + name + "_" + tag + "', function(keys, args)\n" +
		"KEYS, ARGV = keys, args\n" +
		preludeEntry + entry + source(name) +
		"\nend)\n"
	sum := sha1.Sum([]byte(code))
	id := hex.EncodeToString(sum[:8])
	return strings.ReplaceAll(code, tag, id), name + "_" + id
}

// Called is what a shard sees called for the named script (the file name
// without .lua), after the command's name: for claim_many the name of its
// function (FCALL), for the others the SHA1 of the prelude and the script
// (EVALSHA); "" for no such script. Fault tests match commands by it
// (claim_many sent as a script, Form.Script, is matched by SHA).
func Called(name string) string {
	if name == "claim_many" {
		return claimFunction
	}
	return SHA(name)
}

// SHA is the SHA1 of the named script with the prelude in front, as
// EVALSHA sends it; "" for no such script.
func SHA(name string) string {
	if s := scripts[name]; s != nil {
		return s.Hash()
	}
	return ""
}

// Client is what the wrappers need of a shard: *redis.Client satisfies it.
type Client = redis.Scripter

// Loader is what LoadScripts needs of a shard: *redis.Client satisfies it.
type Loader interface {
	Client
	Do(ctx context.Context, args ...any) *redis.Cmd // FUNCTION LOAD
}

// LoadScripts loads every script into c's script cache, so that pipelined
// EVALSHA finds them, and claim_many's library, so that FCALL finds it (on
// a cluster, into every primary: a replica has its primary's libraries). A
// library already loaded is the same code (its name says which): it is
// kept, and not written to the shard's AOF again. A server without
// functions (the try-it mode's, where claim_many runs as a script) is
// given the scripts alone.
func LoadScripts(ctx context.Context, c Loader) error {
	for name, s := range scripts {
		if err := s.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("load script %s: %w", name, err)
		}
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return loadLibrary(ctx, n) })
	}
	return loadLibrary(ctx, c)
}

// loadLibrary loads claim_many's library into the server c reaches.
func loadLibrary(ctx context.Context, c Loader) error {
	err := c.Do(ctx, "function", "load", claimLibrary).Err()
	switch {
	case err == nil, redis.HasErrorPrefix(err, "Library") && strings.Contains(err.Error(), "already exists"):
		return nil
	case redis.HasErrorPrefix(err, "unknown command"):
		return nil // no functions here: claim_many runs as a script
	}
	return fmt.Errorf("load claim_many's library: %w", err)
}

// IsNoScript reports whether err says the shard lacks the script (EVALSHA's
// NOSCRIPT, FCALL's "Function not found"): nothing ran.
func IsNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT") || redis.HasErrorPrefix(err, "Function not found")
}

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
