// Package split divides a red-packet pool's total into integer-cent amounts: a fair
// random split, exact to the cent, within the spec's minimum and maximum.
//
// Amounts are int64 cents and never floats, so the amounts always sum to the total
// exactly. Spec.Validate refuses specs that cannot be met, with a reason fit to show
// to the caller of POST /admin/pools; Amounts refuses them the same way.
package split

import (
	"errors"
	"fmt"
	"math/rand/v2"
)

// MaxCount is the largest Count a Spec may ask for. It bounds the memory of one
// split (8 bytes an amount: 80 MB at the limit) and the time of one preload.
const MaxCount = 10_000_000

// ErrImpossible is returned, wrapped with the reason, when a Spec cannot be met:
// a count or total out of range, a maximum below the minimum, or a total that
// count packets between the minimum and the maximum cannot add up to.
var ErrImpossible = errors.New("split: impossible spec")

// Spec describes a split. Its zero value is not valid: Count and TotalCents must be
// set.
type Spec struct {
	TotalCents int64 // sum of all amounts; ≥ 1
	Count      int64 // number of amounts; 1 … MaxCount
	MinCents   int64 // smallest amount; 0 means the default of 1 cent
	MaxCents   int64 // largest amount; 0 means no maximum
}

// minCents is the effective minimum, with the default filled in.
func (s Spec) minCents() int64 {
	if s.MinCents == 0 {
		return 1
	}
	return s.MinCents
}

// Validate reports whether the spec can be met. Every error is a *SpecError
// (it matches ErrImpossible) and reads as a reason, e.g. "split: impossible spec: total_cents 50 is less than
// count 100 × min_cents 1", using the field names of the admin API.
//
// The products count × min and count × max are never computed, so huge values
// cannot overflow int64: the checks compare against total / count instead.
func (s Spec) Validate() error {
	minC := s.minCents()
	switch {
	case s.Count < 1:
		return impossible("count %d is less than 1", s.Count)
	case s.Count > MaxCount:
		return impossible("count %d is more than the limit %d", s.Count, MaxCount)
	case s.TotalCents < 1:
		return impossible("total_cents %d is less than 1", s.TotalCents)
	case s.MinCents < 0:
		return impossible("min_cents %d is negative", s.MinCents)
	case s.MaxCents < 0:
		return impossible("max_cents %d is negative", s.MaxCents)
	case s.MaxCents > 0 && s.MaxCents < minC:
		return impossible("max_cents %d is less than min_cents %d", s.MaxCents, minC)
	// count × min > total  ⟺  min > ⌊total / count⌋ (all positive).
	case minC > s.TotalCents/s.Count:
		return impossible("total_cents %d is less than count %d × min_cents %d",
			s.TotalCents, s.Count, minC)
	// count × max < total  ⟺  max < ⌈total / count⌉ (all positive).
	case s.MaxCents > 0 && s.MaxCents < (s.TotalCents-1)/s.Count+1:
		return impossible("total_cents %d is more than count %d × max_cents %d",
			s.TotalCents, s.Count, s.MaxCents)
	}
	return nil
}

// SpecError is the error of a Spec that cannot be met: Reason says why, in
// the field names of the admin API. It matches ErrImpossible (errors.Is).
type SpecError struct {
	Reason string
}

func (e *SpecError) Error() string { return ErrImpossible.Error() + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrImpossible) true.
func (e *SpecError) Unwrap() error { return ErrImpossible }

func impossible(format string, args ...any) error {
	return &SpecError{Reason: fmt.Sprintf(format, args...)}
}

// Amounts splits s.TotalCents into s.Count amounts with the double-mean method and
// returns them in random order. It returns a nil slice and an ErrImpossible error
// when s.Validate does. rng must not be nil; Amounts is as safe for concurrent use
// as rng is.
//
// The method: with R cents and n packets left, each of the first Count−1 packets
// is drawn uniformly from [lo, hi], where
//
//	hi = min(max(⌊2R/n⌋, lo), R − (n−1)·min, max)   // twice the mean left, bounded
//	lo = max(min, R − (n−1)·max)                      // the second term only with a max
//
// and the last packet gets what is left. The draw keeps min·n ≤ R ≤ max·n true for
// what is left, so every amount is within bounds and the sum is exact by
// construction. Each draw averages about R/n, the mean of what is left, so every
// amount has expectation total/count and none can take more than about twice its
// share: fair, with a spread of about mean/√3.
//
// The amounts are shuffled (Fisher–Yates) before they are returned because the
// plain sequence is not the same at every position: the later draws come from a
// remainder that has already wandered, the last packet takes whatever is left
// (the widest spread of all), and the min and max clamps bite late. After the
// shuffle a packet's position tells nothing, so the order in which users grab
// them does not matter.
//
// It takes O(Count) time and one allocation: a million amounts take about 20 ms
// (BenchmarkAmounts), about twice the cost of drawing and shuffling a million
// plain random numbers.
func Amounts(rng *rand.Rand, s Spec) ([]int64, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	minC, maxC := s.minCents(), s.MaxCents
	out := make([]int64, s.Count)
	rest := s.TotalCents // R: cents not yet given out
	last := len(out) - 1
	for i := range last {
		after := int64(last - i) // n−1: packets still to fill after this one
		lo := minC
		// R − (n−1)·max, computed only when it cannot overflow; otherwise
		// (n−1)·max > R and the term is negative, below min.
		if maxC > 0 && maxC <= rest/after {
			lo = max(lo, rest-after*maxC)
		}
		// ⌊2R/n⌋ without computing 2R, which can overflow: 2·⌊R/n⌋, plus one when
		// the remainder is at least half of n. n ≥ 2 here, so the result is ≤ R.
		n := after + 1
		q, r := rest/n, rest%n
		hi := 2 * q
		if 2*r >= n {
			hi++
		}
		hi = max(hi, lo)
		hi = min(hi, rest-after*minC) // (n−1)·min ≤ R by the invariant
		if maxC > 0 {
			hi = min(hi, maxC)
		}
		v := lo + rng.Int64N(hi-lo+1)
		out[i] = v
		rest -= v
	}
	out[last] = rest
	for i := last; i > 0; i-- {
		j := rng.IntN(i + 1)
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
