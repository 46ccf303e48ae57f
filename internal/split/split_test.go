package split

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want string // "" for a valid spec
	}{
		{"count 0", Spec{TotalCents: 100, Count: 0},
			"split: impossible spec: count 0 is less than 1"},
		{"count negative", Spec{TotalCents: 100, Count: -5},
			"split: impossible spec: count -5 is less than 1"},
		{"count over limit", Spec{TotalCents: 1e12, Count: MaxCount + 1},
			"split: impossible spec: count 10000001 is more than the limit 10000000"},
		{"total 0", Spec{TotalCents: 0, Count: 1},
			"split: impossible spec: total_cents 0 is less than 1"},
		{"total negative", Spec{TotalCents: -100, Count: 1},
			"split: impossible spec: total_cents -100 is less than 1"},
		{"min negative", Spec{TotalCents: 100, Count: 1, MinCents: -1},
			"split: impossible spec: min_cents -1 is negative"},
		{"max negative", Spec{TotalCents: 100, Count: 1, MaxCents: -1},
			"split: impossible spec: max_cents -1 is negative"},
		{"max below min", Spec{TotalCents: 100, Count: 10, MinCents: 10, MaxCents: 5},
			"split: impossible spec: max_cents 5 is less than min_cents 10"},
		{"total below count × default min", Spec{TotalCents: 50, Count: 100},
			"split: impossible spec: total_cents 50 is less than count 100 × min_cents 1"},
		{"total below count × min by one", Spec{TotalCents: 999, Count: 10, MinCents: 100},
			"split: impossible spec: total_cents 999 is less than count 10 × min_cents 100"},
		{"total above count × max by one", Spec{TotalCents: 1001, Count: 10, MaxCents: 100},
			"split: impossible spec: total_cents 1001 is more than count 10 × max_cents 100"},
		{"count × min overflows", Spec{TotalCents: math.MaxInt64, Count: MaxCount, MinCents: 1e15},
			"split: impossible spec: total_cents 9223372036854775807 is less than count 10000000 × min_cents 1000000000000000"},
		{"count × min overflows at MaxInt64", Spec{TotalCents: math.MaxInt64, Count: 2, MinCents: math.MaxInt64},
			"split: impossible spec: total_cents 9223372036854775807 is less than count 2 × min_cents 9223372036854775807"},

		{"one packet", Spec{TotalCents: 1, Count: 1}, ""},
		{"total == count × min", Spec{TotalCents: 1000, Count: 10, MinCents: 100}, ""},
		{"total == count × max", Spec{TotalCents: 1000, Count: 10, MaxCents: 100}, ""},
		{"max == min", Spec{TotalCents: 1000, Count: 10, MinCents: 100, MaxCents: 100}, ""},
		{"max == default min", Spec{TotalCents: 10, Count: 10, MaxCents: 1}, ""},
		{"count at limit", Spec{TotalCents: MaxCount, Count: MaxCount}, ""},
		{"count × max overflows", Spec{TotalCents: 1e12, Count: MaxCount, MaxCents: 1e15}, ""},
		{"total MaxInt64", Spec{TotalCents: math.MaxInt64, Count: 2, MaxCents: math.MaxInt64}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.spec.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tt.spec, err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("Validate(%+v) = %v, want %q", tt.spec, err, tt.want)
			}
			if !errors.Is(err, ErrImpossible) {
				t.Fatalf("Validate(%+v) = %v, want it to wrap ErrImpossible", tt.spec, err)
			}
		})
	}
}

// checkAmounts fails t unless amounts is a split of s: Count amounts, summing to
// TotalCents, each within [min, max].
func checkAmounts(t interface {
	Helper()
	Fatalf(string, ...any)
}, s Spec, amounts []int64) {
	t.Helper()
	if int64(len(amounts)) != s.Count {
		t.Fatalf("len(Amounts(%+v)) = %d, want %d", s, len(amounts), s.Count)
	}
	minC := s.minCents()
	var sum int64
	for i, a := range amounts {
		if a < minC || s.MaxCents > 0 && a > s.MaxCents {
			t.Fatalf("Amounts(%+v)[%d] = %d, want in [%d, %d] (max 0: none)", s, i, a, minC, s.MaxCents)
		}
		// Partial sums of positive amounts stay ≤ the total while the total holds,
		// so this addition overflows only if the sum is already wrong.
		if sum > math.MaxInt64-a {
			t.Fatalf("sum(Amounts(%+v)) overflows at [%d], want %d", s, i, s.TotalCents)
		}
		sum += a
	}
	if sum != s.TotalCents {
		t.Fatalf("sum(Amounts(%+v)) = %d, want %d", s, sum, s.TotalCents)
	}
}

// validSpec draws a spec that Validate accepts, leaning on the edges: totals at
// count × min and count × max, max == min, a single packet, totals near 1e12 and
// near MaxInt64.
func validSpec(t *rapid.T) Spec {
	count := rapid.Int64Range(1, 2000).Draw(t, "count")
	minCents := rapid.Int64Range(0, 1_000_000).Draw(t, "min") // 0: the default
	minC := max(minCents, 1)
	s := Spec{Count: count, MinCents: minCents}
	switch rapid.SampledFrom([]string{
		"unbounded", "bounded", "at_min", "at_max", "max_eq_min", "big", "huge",
	}).Draw(t, "shape") {
	case "unbounded":
		s.TotalCents = count*minC + rapid.Int64Range(0, 1e9).Draw(t, "extra")
	case "bounded":
		s.MaxCents = minC + rapid.Int64Range(0, 1e6).Draw(t, "max_over_min")
		s.TotalCents = rapid.Int64Range(count*minC, count*s.MaxCents).Draw(t, "total")
	case "at_min":
		s.MaxCents = rapid.SampledFrom([]int64{0, minC, minC + 1, 2 * minC, 1e12}).Draw(t, "max")
		s.TotalCents = count * minC
	case "at_max":
		s.MaxCents = minC + rapid.Int64Range(0, 1e6).Draw(t, "max_over_min")
		s.TotalCents = count * s.MaxCents
	case "max_eq_min":
		s.MaxCents = minC
		s.TotalCents = count * minC
	case "big":
		s.TotalCents = rapid.Int64Range(1e12-1e6, 1e12).Draw(t, "total")
		if rapid.Bool().Draw(t, "bounded") {
			// At least the mean, so the spec stays valid.
			s.MaxCents = (s.TotalCents-1)/count + 1 + rapid.Int64Range(0, 1e9).Draw(t, "max_over_mean")
		}
	case "huge":
		s.Count = min(count, 5)
		s.TotalCents = rapid.Int64Range(math.MaxInt64-1e6, math.MaxInt64).Draw(t, "total")
		s.MaxCents = rapid.SampledFrom([]int64{0, math.MaxInt64, math.MaxInt64/2 + 1}).Draw(t, "max")
		if s.Count == 1 && s.MaxCents > 0 {
			s.MaxCents = math.MaxInt64
		}
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("validSpec drew %+v, which Validate rejects: %v", s, err)
	}
	return s
}

func TestAmountsProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := validSpec(t)
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
		amounts, err := Amounts(rng, s)
		if err != nil {
			t.Fatalf("Amounts(%+v) = %v, want no error", s, err)
		}
		checkAmounts(t, s, amounts)
	})
}

// TestAmountsAgreesWithValidate draws specs around the edges of validity, many of
// them impossible: Amounts must refuse exactly those Validate refuses.
func TestAmountsAgreesWithValidate(t *testing.T) {
	edge := rapid.SampledFrom([]int64{math.MinInt64, -1, 0, 1, MaxCount, MaxCount + 1, 1e15, math.MaxInt64})
	rapid.Check(t, func(t *rapid.T) {
		s := Spec{
			TotalCents: rapid.OneOf(rapid.Int64Range(-10, 12_000), edge).Draw(t, "total"),
			Count:      rapid.OneOf(rapid.Int64Range(-3, 200), edge).Draw(t, "count"),
			MinCents:   rapid.OneOf(rapid.Int64Range(-3, 80), edge).Draw(t, "min"),
			MaxCents:   rapid.OneOf(rapid.Int64Range(-3, 100), edge).Draw(t, "max"),
		}
		if s.Count > 10_000 {
			// Valid specs this large would make the check slow; keep them
			// impossible by another rule so the refusal path still sees them.
			s.TotalCents = min(s.TotalCents, s.Count-1)
		}
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 0))
		amounts, err := Amounts(rng, s)
		if verr := s.Validate(); verr != nil {
			if !errors.Is(err, ErrImpossible) || amounts != nil {
				t.Fatalf("Amounts(%+v) = %d amounts, %v; want nil, ErrImpossible (Validate: %v)",
					s, len(amounts), err, verr)
			}
			if err.Error() != verr.Error() {
				t.Fatalf("Amounts(%+v) error %q, want Validate's %q", s, err, verr)
			}
			return
		}
		if err != nil {
			t.Fatalf("Amounts(%+v) = %v, want no error for a spec Validate accepts", s, err)
		}
		checkAmounts(t, s, amounts)
	})
}

// TestAmountsExtremes covers the corners where a careless 2·R or (n−1)·max
// overflows int64.
func TestAmountsExtremes(t *testing.T) {
	tests := []Spec{
		{TotalCents: math.MaxInt64, Count: 1},
		{TotalCents: math.MaxInt64, Count: 2},
		{TotalCents: math.MaxInt64, Count: 3, MaxCents: math.MaxInt64},
		{TotalCents: math.MaxInt64, Count: 2, MaxCents: math.MaxInt64/2 + 1},
		{TotalCents: math.MaxInt64 - 1, Count: 2, MinCents: math.MaxInt64 / 2, MaxCents: math.MaxInt64 / 2},
		{TotalCents: 1e12, Count: 1000, MaxCents: 1e18},
		{TotalCents: 1e6, Count: 1e6, MaxCents: 1},
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for _, s := range tests {
		for range 5 {
			amounts, err := Amounts(rng, s)
			if err != nil {
				t.Fatalf("Amounts(%+v) = %v, want no error", s, err)
			}
			checkAmounts(t, s, amounts)
		}
	}
}

// TestAmountsFair checks the distribution over many pools with a fixed seed, so it
// is deterministic; the bands are several standard errors wide, so it does not hang
// on this one seed either.
func TestAmountsFair(t *testing.T) {
	const (
		pools = 2000
		count = 100
		total = 10_000
		mean  = total / count
	)
	s := Spec{TotalCents: total, Count: count}
	rng := rand.New(rand.NewPCG(2027, 1))

	var sum, sumSq float64
	var posSum, posSq [count]float64
	var grand int64
	minSeen := int64(math.MaxInt64)
	for range pools {
		amounts, err := Amounts(rng, s)
		if err != nil {
			t.Fatalf("Amounts(%+v) = %v, want no error", s, err)
		}
		for i, a := range amounts {
			grand += a
			minSeen = min(minSeen, a)
			f := float64(a)
			sum += f
			sumSq += f * f
			posSum[i] += f
			posSq[i] += f * f
		}
	}
	stddev := func(sum, sumSq, n float64) float64 {
		m := sum / n
		return math.Sqrt(sumSq/n - m*m)
	}

	if grand != pools*total {
		t.Fatalf("sum of all amounts = %d, want exactly %d (mean %d)", grand, pools*total, mean)
	}
	if minSeen < 1 {
		t.Fatalf("smallest amount = %d, want ≥ 1", minSeen)
	}
	sd := stddev(sum, sumSq, pools*count)
	t.Logf("overall: mean %.3f, std dev %.2f (%.3f × mean; 1/√3 = %.3f), smallest %d",
		sum/(pools*count), sd, sd/mean, 1/math.Sqrt(3), minSeen)
	if r := sd / mean; r < 0.4 || r > 0.75 {
		t.Errorf("std dev = %.2f = %.3f × mean, want 0.4–0.75 × mean", sd, r)
	}

	// After the shuffle every position is alike: the same mean and the same spread.
	// The standard error of a position's mean is about 58/√2000 ≈ 1.3 cents, so 5%
	// is almost 4 of them. Without the shuffle the last two positions spread about
	// 0.8 × mean (they take what the earlier draws left), outside the band below.
	for _, i := range []int{0, count / 2, count - 1} {
		m := posSum[i] / pools
		psd := stddev(posSum[i], posSq[i], pools)
		t.Logf("position %d: mean %.2f, std dev %.2f", i, m, psd)
		if math.Abs(m-mean) > 0.05*mean {
			t.Errorf("mean at position %d = %.2f, want within 5%% of %d", i, m, mean)
		}
		if r := psd / mean; r < 0.4 || r > 0.75 {
			t.Errorf("std dev at position %d = %.2f = %.3f × mean, want 0.4–0.75 × mean", i, psd, r)
		}
	}
	worst := 0.0
	for i := range count {
		worst = max(worst, math.Abs(posSum[i]/pools-mean))
	}
	t.Logf("largest deviation of a position's mean from %d: %.2f", mean, worst)
	if worst > 0.08*mean {
		t.Errorf("a position's mean is %.2f from %d, want within 8%%", worst, mean)
	}
}

func BenchmarkAmounts(b *testing.B) {
	for _, bc := range []struct {
		name string
		spec Spec
	}{
		// The pool of the API example: 5,000,000.00 in a million packets.
		{"count=1e6", Spec{TotalCents: 500_000_000, Count: 1_000_000}},
		{"count=1e6/max", Spec{TotalCents: 500_000_000, Count: 1_000_000, MinCents: 100, MaxCents: 1000}},
	} {
		b.Run(bc.name, func(b *testing.B) { benchmarkAmounts(b, bc.spec) })
	}
}

func benchmarkAmounts(b *testing.B, s Spec) {
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Amounts(rng, s); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(s.Count), "ns/amount")
}

// BenchmarkBaseline fills and shuffles as many uniform draws, with no split: the
// floor that Amounts is measured against.
func BenchmarkBaseline(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	for b.Loop() {
		out := make([]int64, 1_000_000)
		for i := range out {
			out[i] = 1 + rng.Int64N(1000)
		}
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
}
