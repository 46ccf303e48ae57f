package shard

// This file reads what each shard's persistence promises. rain answers a
// grant only after its shard acknowledged it; the grant survives a power
// loss of the shard's host only if the shard wrote it to its append-only
// file and fsynced it before that acknowledgement, which Redis does with
// appendonly yes and appendfsync always (it fsyncs before it replies, and a
// pipelined batch shares one fsync).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Durability is one shard's persistence settings as CONFIG GET reports them.
type Durability struct {
	Shard       string
	AppendOnly  string // "yes" or "no"; "" when unknown
	AppendFsync string // "always", "everysec" or "no"; "" when unknown
	// Err is set when the settings could not be read (CONFIG not allowed or
	// renamed, the shard down): durability unknown.
	Err error
}

// Durable reports whether an acknowledged write survives a power loss of
// the shard's host.
func (d Durability) Durable() bool { return d.AppendOnly == "yes" && d.AppendFsync == "always" }

// String says what the settings promise, naming the shard and the setting.
func (d Durability) String() string {
	switch {
	case d.Err != nil:
		return fmt.Sprintf("shard %s: durability unknown (CONFIG GET failed: %v)", d.Shard, d.Err)
	case d.AppendOnly != "yes":
		return fmt.Sprintf("shard %s: appendonly is %q: a restart loses every grant (want appendonly yes, appendfsync always)", d.Shard, d.AppendOnly)
	case d.AppendFsync != "always":
		return fmt.Sprintf("shard %s: appendfsync is %q: a power loss of its host can lose acknowledged grants (want appendfsync always)", d.Shard, d.AppendFsync)
	}
	return fmt.Sprintf("shard %s: appendonly yes, appendfsync always", d.Shard)
}

// ErrNoAppendOnly is a Durability's Err when the shard answered CONFIG GET
// without appendonly.
var ErrNoAppendOnly = errors.New("CONFIG GET answered no appendonly")

// Durability reads every shard's appendonly and appendfsync at once, in
// name order; a cluster shard's, every primary's (Shard "cluster/addr").
func (s *Set) Durability(ctx context.Context) []Durability {
	out := make([][]Durability, len(s.names))
	var wg sync.WaitGroup
	for i, name := range s.names {
		wg.Go(func() {
			if cl := s.clusters[name]; cl != nil {
				out[i] = cl.durability(ctx)
				return
			}
			out[i] = []Durability{durabilityOf(ctx, name, s.clients[name])}
		})
	}
	wg.Wait()
	var all []Durability
	for _, ds := range out {
		all = append(all, ds...)
	}
	return all
}

// durabilityOf reads one server's settings.
func durabilityOf(ctx context.Context, name string, c redis.Cmdable) Durability {
	d := Durability{Shard: name}
	m, err := c.ConfigGet(ctx, "append*").Result()
	if err != nil {
		d.Err = err
	} else {
		d.AppendOnly, d.AppendFsync = m["appendonly"], m["appendfsync"]
		if d.AppendOnly == "" {
			d.Err = ErrNoAppendOnly
		}
	}
	return d
}

// durability reads every primary's settings, in address order; a cluster
// that cannot be read is one entry with the error.
func (cl *cluster) durability(ctx context.Context) []Durability {
	ps, err := cl.primaries(ctx)
	if err != nil {
		return []Durability{{Shard: cl.name, Err: err}}
	}
	out := make([]Durability, len(ps))
	for i, p := range ps {
		out[i] = durabilityOf(ctx, cl.name+"/"+p.Addr, cl.node(p.Addr))
	}
	slices.SortFunc(out, func(a, b Durability) int { return cmpString(a.Shard, b.Shard) })
	return out
}
