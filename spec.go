package rain

// This file is what an operator's pool spec is: its fields, its limits,
// the id rules, and how rain fills in what the operator leaves out.

import (
	"errors"
	"fmt"
	"time"

	"rain/internal/split"
)

// Limits of a pool spec.
const (
	MaxIDLen = 64
	// MaxTotalCents keeps every sum exact in Lua, whose numbers are doubles
	// (exact to 2^53 ≈ 9e15).
	MaxTotalCents = 1_000_000_000_000_000
	// MaxSubPools bounds the sub-pools of one pool (the grab path's local
	// memory of empty sub-pools holds as many).
	MaxSubPools = 1024
	// DefaultHoldSeconds is how long a grant waits for confirmation by default.
	DefaultHoldSeconds = 600
	// MaxHoldSeconds bounds hold_seconds (30 days).
	MaxHoldSeconds = 30 * 24 * 3600
)

// IDRule is the id syntax of docs/api.md, for messages.
const IDRule = "1-64 characters from [A-Za-z0-9_.:-]"

// ValidID reports whether s is a valid pool or user id: 1–64 characters from
// A-Z a-z 0-9 _ - . : (ids end up inside Redis keys, and need no escaping in
// JSON).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !IDByte(s[i]) {
			return false
		}
	}
	return true
}

// IDByte reports whether c may appear in an id.
func IDByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == '-' || c == '.' || c == ':'
}

// CheckID returns nil for a valid id, else an error that names the field
// (as the caller spells it: "pool_id", "--pool") and the rule.
func CheckID(field, id string) error {
	if ValidID(id) {
		return nil
	}
	if len(id) > 80 {
		id = id[:80] + "..."
	}
	return fmt.Errorf("%s %q: want %s", field, id, IDRule)
}

// Spec is an operator's pool, as POST /admin/pools takes it.
type Spec struct {
	PoolID      string     `json:"pool_id"`
	TotalCents  int64      `json:"total_cents"`
	Count       int64      `json:"count"`
	MinCents    int64      `json:"min_cents"`    // 0 = 1 cent
	MaxCents    int64      `json:"max_cents"`    // 0 = no maximum
	SubPools    int        `json:"sub_pools"`    // 0 = chosen by rain
	StartsAt    *time.Time `json:"starts_at"`    // nil = open at once
	EndsAt      *time.Time `json:"ends_at"`      // nil = no end
	HoldSeconds int64      `json:"hold_seconds"` // 0 = DefaultHoldSeconds
}

// Normalize fills defaults and validates. Every error wraps ErrInvalid with a
// reason fit for the caller.
func (s Spec) Normalize() (Spec, error) {
	if err := CheckID("pool_id", s.PoolID); err != nil {
		return s, readable(ErrInvalid, err)
	}
	if s.MinCents == 0 {
		s.MinCents = 1
	}
	if s.HoldSeconds == 0 {
		s.HoldSeconds = DefaultHoldSeconds
	}
	sp := split.Spec{TotalCents: s.TotalCents, Count: s.Count, MinCents: s.MinCents, MaxCents: s.MaxCents}
	if err := sp.Validate(); err != nil {
		var se *split.SpecError
		if errors.As(err, &se) {
			return s, Errorf(ErrInvalid, nil, "%s", se.Reason)
		}
		return s, readable(ErrInvalid, err)
	}
	switch {
	case s.TotalCents > MaxTotalCents:
		return s, Errorf(ErrInvalid, nil, "total_cents %d is more than the limit %d", s.TotalCents, int64(MaxTotalCents))
	case s.SubPools < 0 || s.SubPools > MaxSubPools:
		return s, Errorf(ErrInvalid, nil, "sub_pools %d is not within 0-%d", s.SubPools, MaxSubPools)
	case int64(s.SubPools) > s.Count:
		return s, Errorf(ErrInvalid, nil, "sub_pools %d is more than count %d", s.SubPools, s.Count)
	case s.HoldSeconds < 0 || s.HoldSeconds > MaxHoldSeconds:
		return s, Errorf(ErrInvalid, nil, "hold_seconds %d is not within 1-%d", s.HoldSeconds, MaxHoldSeconds)
	}
	// Times are kept to the millisecond in UTC, as the shards compare them.
	for _, t := range []**time.Time{&s.StartsAt, &s.EndsAt} {
		if *t != nil {
			if (*t).UnixMilli() <= 0 {
				return s, Errorf(ErrInvalid, nil, "times must be after 1970")
			}
			u := time.UnixMilli((*t).UnixMilli()).UTC()
			*t = &u
		}
	}
	// A window is at least MinWindow long, once rounded to the millisecond
	// (a sub-millisecond window would be stored empty: a pool nobody can
	// grab from).
	if s.StartsAt != nil && s.EndsAt != nil {
		if d := s.EndsAt.Sub(*s.StartsAt); d < MinWindow {
			return s, Errorf(ErrInvalid, nil, "the window from starts_at to ends_at is %v long; it must be at least %v", d, MinWindow)
		}
	}
	return s, nil
}

// MinWindow is the shortest window from starts_at to ends_at a preload takes.
const MinWindow = time.Second
