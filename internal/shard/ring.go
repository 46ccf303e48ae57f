// Package shard owns the set of named Redis shards rain spreads its pools over
// and the weighted consistent-hash ring that places keys on them.
//
// A shard is a Spec: a name, a weight and an address (spec.go parses the
// operator's "s1=1@10.0.0.5:6379,s2=2@10.0.0.6:6379" list). The Ring hashes
// names only, never addresses, so moving a shard to a new address moves no
// keys, and adding a shard moves only the keys the new shard takes over.
package shard

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
)

// DefaultVNodes is the number of virtual nodes per unit of weight when
// NewRing is given vnodes ≤ 0; 160 is what ketama uses.
const DefaultVNodes = 160

// maxPoints bounds Σ weight × vnodes, so that a mistaken vnodes cannot
// overflow or exhaust memory (each point costs 12 bytes).
const maxPoints = 1 << 24

// Ring is a weighted consistent-hash ring over named shards. A shard of
// weight w has w × vnodes points on the ring; point r of shard "s1" sits at
// xxhash.Sum64String("s1#" + strconv.Itoa(r)), for r in [0, w × vnodes). A key
// belongs to the shard of the first point at or after xxhash.Sum64String(key),
// wrapping past the top. Positions depend only on names and replica numbers,
// so the same set of specs gives the same ring in any order on any machine.
//
// A Ring is immutable once built and safe for concurrent use. The zero Ring
// is not usable: build one with NewRing.
type Ring struct {
	specs  []Spec   // sorted by name; owners index into it
	names  []string // names[i] == specs[i].Name
	hashes []uint64 // point positions, sorted ascending; ties broken by owner name
	owners []uint32 // owners[i] is the index into specs of the point at hashes[i]

	// hash replaces xxhash.Sum64String for keys and point positions when
	// non-nil. Only tests set it (through newRing), so positions can be
	// worked out by hand and collisions forced.
	hash func(string) uint64
}

// NewRing builds a ring of specs with weight × vnodes points per shard;
// vnodes ≤ 0 means DefaultVNodes. Every spec must meet the rules ParseSpecs
// enforces (names unique, weight 1–1000, a valid host:port), and there must
// be at least one.
func NewRing(specs []Spec, vnodes int) (*Ring, error) {
	return newRing(specs, vnodes, nil)
}

// newRing is NewRing with the hash replaced by hash when non-nil.
func newRing(specs []Spec, vnodes int, hash func(string) uint64) (*Ring, error) {
	if len(specs) == 0 {
		return nil, errors.New("shard ring: no shards")
	}
	if vnodes <= 0 {
		vnodes = DefaultVNodes
	}
	r := &Ring{specs: slices.Clone(specs), hash: hash}
	slices.SortFunc(r.specs, func(a, b Spec) int { return strings.Compare(a.Name, b.Name) })

	total := 0
	for i, s := range r.specs {
		if err := s.validate(); err != nil {
			return nil, fmt.Errorf("shard spec %q: %w", s, err)
		}
		if i > 0 && s.Name == r.specs[i-1].Name {
			return nil, fmt.Errorf("shard spec %q: duplicate name %q", s, s.Name)
		}
		// Weight ≤ 1000, so checking before the multiplication keeps
		// it from overflowing.
		if vnodes > maxPoints || total+s.Weight*vnodes > maxPoints {
			return nil, fmt.Errorf("shard ring: more than %d points (lower vnodes %d or the weights)", maxPoints, vnodes)
		}
		total += s.Weight * vnodes
	}

	r.names = make([]string, len(r.specs))
	type point struct {
		hash  uint64
		owner uint32
	}
	points := make([]point, 0, total)
	var buf []byte
	for i, s := range r.specs {
		r.names[i] = s.Name
		buf = append(buf[:0], s.Name...)
		buf = append(buf, '#')
		n := len(buf)
		for rep := range s.Weight * vnodes {
			buf = strconv.AppendInt(buf[:n], int64(rep), 10)
			points = append(points, point{r.posHash(buf), uint32(i)})
		}
	}
	// specs are sorted by name, so ordering ties by owner index orders
	// them by name: the ring does not depend on the order of specs even
	// when positions collide.
	slices.SortFunc(points, func(a, b point) int {
		if a.hash != b.hash {
			if a.hash < b.hash {
				return -1
			}
			return 1
		}
		return int(a.owner) - int(b.owner)
	})
	r.hashes = make([]uint64, len(points))
	r.owners = make([]uint32, len(points))
	for i, p := range points {
		r.hashes[i], r.owners[i] = p.hash, p.owner
	}
	return r, nil
}

// posHash is the position of the point named by b ("name#replica").
func (r *Ring) posHash(b []byte) uint64 {
	if r.hash != nil {
		return r.hash(string(b))
	}
	return xxhash.Sum64(b) // same value as Sum64String(string(b)), no allocation
}

func (r *Ring) keyHash(key string) uint64 {
	if r.hash != nil {
		return r.hash(key)
	}
	return xxhash.Sum64String(key)
}

// index returns the index of the first point at or after h, wrapping to 0.
// Rain walks the ring only to place a pool's sub-pools at preload, so a
// binary search is all it needs.
func (r *Ring) index(h uint64) int {
	i, _ := slices.BinarySearch(r.hashes, h)
	if i == len(r.hashes) {
		i = 0
	}
	return i
}

// Distinct returns the names of up to k distinct shards met walking the ring
// clockwise from key's position: the first owns key, and no name repeats. k
// is clamped to [0, the number of shards].
func (r *Ring) Distinct(key string, k int) []string {
	k = min(k, len(r.specs))
	if k <= 0 {
		return nil
	}
	out := make([]string, 0, k)
	seen := make([]bool, len(r.specs))
	// Every shard has at least one point, so one turn of the ring meets
	// all of them and the loop ends before i comes back to start.
	start := r.index(r.keyHash(key))
	for i := start; len(out) < k; {
		if o := r.owners[i]; !seen[o] {
			seen[o] = true
			out = append(out, r.names[o])
		}
		if i++; i == len(r.hashes) {
			i = 0
		}
	}
	return out
}
