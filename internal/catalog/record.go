package catalog

// This file is how a pool's record is stored: its keys, and the record as
// a hash of fields beside the spec in the form it was first stored.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"rain"
)

// record is a pool's record as stored under rain:{P}:pool: the pool, and
// its spec as stored (canonical at its preload). Two preloads are of one
// pool when their specs as stored are equal, and a record is written back
// with its spec byte for byte (record.lua compares it), never marshalled
// anew.
type record struct {
	rain.Pool
	spec string
}

// recordKey is the key of a pool's record; its hash tag is the pool's own.
func recordKey(pool string) string { return "rain:{" + pool + "}:pool" }

// registryKey lists every pool id on a shard.
const registryKey = "rain:pools"

// same reports whether r and o are copies of one pool's record: the same
// spec, seed and placement (their states and accounts may differ).
func (r *record) same(o *record) bool {
	return r.spec == o.spec && r.Seed == o.Seed && slices.Equal(r.Placement, o.Placement) && slices.Equal(r.Salts, o.Salts)
}

// fields is the record as stored.
func (r *record) fields() map[string]string {
	f := map[string]string{
		"spec": r.spec, "seed": strconv.FormatUint(r.Seed, 10),
		"placement": strings.Join(r.Placement, ","), "state": string(r.State),
	}
	if r.Account != nil {
		b, _ := json.Marshal(r.Account) // plain fields cannot fail
		f["account"] = string(b)
	}
	if slices.ContainsFunc(r.Salts, func(s string) bool { return s != "" }) {
		f["tags"] = strings.Join(r.Salts, ",")
	}
	return f
}

// parseRecord reads a record as stored.
func parseRecord(m map[string]string) (*record, error) {
	r := &record{spec: m["spec"], Pool: rain.Pool{State: rain.State(m["state"])}}
	if err := json.Unmarshal([]byte(r.spec), &r.Spec); err != nil {
		return nil, fmt.Errorf("pool record: spec: %w", err)
	}
	seed, err := strconv.ParseUint(m["seed"], 10, 64)
	if err != nil {
		return nil, fmt.Errorf("pool record: seed: %w", err)
	}
	r.Seed = seed
	if m["placement"] == "" {
		return nil, errors.New("pool record: no placement")
	}
	r.Placement = strings.Split(m["placement"], ",")
	r.Salts = make([]string, len(r.Placement))
	if t := m["tags"]; t != "" {
		if r.Salts = strings.Split(t, ","); len(r.Salts) != len(r.Placement) {
			return nil, fmt.Errorf("pool record: %d tags for %d sub-pools", len(r.Salts), len(r.Placement))
		}
	}
	if a := m["account"]; a != "" {
		r.Account = &rain.Account{}
		if err := json.Unmarshal([]byte(a), r.Account); err != nil {
			return nil, fmt.Errorf("pool record: account: %w", err)
		}
	}
	if r.State.Over() && r.Account == nil {
		return nil, fmt.Errorf("pool record: %s without its account", r.State)
	}
	return r, nil
}
