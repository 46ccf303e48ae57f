package rain

// This file is a sub-pool's name and where its data lives: its hash tag and
// its keys, built in one place. Key names are data: a live pool's keys are
// found by these exact names, so a name here never changes (see Keys).

import (
	"strconv"
	"strings"
)

// SubPool names sub-pool Index of pool Pool. Salt, when not empty, is part
// of its hash tag: chosen at preload so that the sub-pool's slot falls on a
// given primary of a cluster shard (see Tag).
type SubPool struct {
	Pool  string
	Index int
	Salt  string // digits, or "" (every sub-pool not on a cluster)
}

// SubPoolRef names a sub-pool and the shard that holds it.
type SubPoolRef struct {
	SubPool
	Shard string
}

// Keys are the Redis keys of one sub-pool. A close frees them all
// (internal/catalog's life.go). While the pool is live, the outbox holds
// only what settlement has not acknowledged (it deletes what it settles);
// the records below that only grow are kept on purpose until the close:
// Grants is each user's one grant (the dedup: a user who grabs again must
// meet it, and the audit counts it); Resolved and Verdicts are each spill's
// outcome, which the audit matches token by token across sub-pools and a
// re-sent take, ack or adopt must find to answer as its first run did;
// Stock shrinks, and holds the unclaimed money the account reports.
//
// Resolved, the transfers a spill's last step resolved (acked or untaken),
// is stored under the suffix ":settled", the name earlier versions gave it:
// a key's name is data, and a new one would strand the transfers a live
// pool holds when rain is upgraded under it.
type Keys struct {
	Meta      string // hash: spec, state, counters
	Stock     string // list: pre-split amounts
	Grants    string // hash: user -> "state:amount:serial:deadline_ms"
	Deadlines string // zset: user by deadline_ms (a grant alone at its deadline; the form of every release before batches)
	// Batches is the deadline index of grants made together: zset of the
	// users of one batch's grants, separated by spaces, by their shared
	// deadline_ms. A key of its own, so that a reaper of an earlier
	// release, which reads a member of Deadlines as one user, never meets
	// one (docs/operations.md, upgrades).
	Batches   string
	Outbox    string // stream: grants for settlement
	Reserve   string // hash: user -> "token:ms", spill reservations (as a home)
	Transfers string // hash: token -> "amount:home:ms:user", spills out in flight (as a sibling)
	Resolved  string // hash: token -> "a|u:amount:home:ms:user", spills out acked or untaken
	Verdicts  string // hash: token -> "a:origin:amount:deadline_ms:user" | "r:user" (as a home)
}

// Tag is the sub-pool's hash tag, "{P:j}", or "{P:j~salt}" with a salt.
// Pool ids cannot contain braces or '~'.
func (s SubPool) Tag() string {
	if s.Salt != "" {
		return "{" + s.Pool + ":" + strconv.Itoa(s.Index) + "~" + s.Salt + "}"
	}
	return "{" + s.Pool + ":" + strconv.Itoa(s.Index) + "}"
}

// Keys builds the sub-pool's keys; they all carry Tag. It is the only place
// sub-pool keys are made.
func (s SubPool) Keys() Keys {
	p := "rain:" + s.Tag() + ":"
	return Keys{
		Meta:      p + "meta",
		Stock:     p + "stock",
		Grants:    p + "grants",
		Deadlines: p + "deadlines",
		Outbox:    p + "outbox",
		Reserve:   p + "reserve",
		Transfers: p + "transfers",
		Resolved:  p + "settled", // its earlier name, kept: see Keys
		Verdicts:  p + "verdicts",
		Batches:   p + "deadline_batches",
	}
}

// All lists every key of the sub-pool.
func (k Keys) All() []string {
	return []string{k.Meta, k.Stock, k.Grants, k.Deadlines, k.Outbox, k.Reserve, k.Transfers, k.Resolved, k.Verdicts, k.Batches}
}

// ParseOutbox is the sub-pool whose outbox key is key (as Keys builds it);
// ok is false for any other key.
func ParseOutbox(key string) (sp SubPool, ok bool) {
	return parseKey(key, "}:outbox", func(k Keys) string { return k.Outbox })
}

// ParseMeta is the sub-pool whose meta key is key (as Keys builds it); ok
// is false for any other key.
func ParseMeta(key string) (sp SubPool, ok bool) {
	return parseKey(key, "}:meta", func(k Keys) string { return k.Meta })
}

// parseKey returns the sub-pool whose key (the one that key of Keys picks,
// ending in suffix) is key.
func parseKey(key, suffix string, of func(Keys) string) (sp SubPool, ok bool) {
	tag, found := strings.CutPrefix(key, "rain:{")
	if !found {
		return sp, false
	}
	if tag, found = strings.CutSuffix(tag, suffix); !found {
		return sp, false
	}
	tag, salt, _ := strings.Cut(tag, "~")
	i := strings.LastIndexByte(tag, ':')
	if i <= 0 {
		return sp, false
	}
	j, err := strconv.Atoi(tag[i+1:])
	if err != nil || j < 0 || strconv.Itoa(j) != tag[i+1:] {
		return sp, false
	}
	sp = SubPool{Pool: tag[:i], Index: j, Salt: salt}
	return sp, of(sp.Keys()) == key
}
