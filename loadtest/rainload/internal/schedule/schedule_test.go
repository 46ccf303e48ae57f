package schedule

import (
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// all drains s.
func all(t *testing.T, s *Schedule) []time.Duration {
	t.Helper()
	var out []time.Duration
	for {
		at, ok := s.Next()
		if !ok {
			return out
		}
		if n := len(out); n > 0 && at < out[n-1] {
			t.Fatalf("arrival %d at %v, before arrival %d at %v", n, at, n-1, out[n-1])
		}
		out = append(out, at)
	}
}

// count returns how many of arrivals fall in [from, to).
func count(arrivals []time.Duration, from, to time.Duration) int {
	n := 0
	for _, a := range arrivals {
		if a >= from && a < to {
			n++
		}
	}
	return n
}

func TestConstant(t *testing.T) {
	s, err := Constant(500, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := all(t, s)
	if len(got) != 1000 {
		t.Fatalf("arrivals = %d, want 1000", len(got))
	}
	for i, at := range got {
		if want := time.Duration(i) * 2 * time.Millisecond; at != want {
			t.Fatalf("arrival %d at %v, want %v (n/rate)", i, at, want)
		}
	}
	if s.Duration() != 2*time.Second {
		t.Errorf("Duration() = %v, want 2s", s.Duration())
	}
}

func TestStagesCounts(t *testing.T) {
	tests := []struct {
		name   string
		start  float64
		stages string
		want   []float64 // arrivals per stage
	}{
		{"k6 spike", 0, "5s:1000,10s:8000,5s:8000,5s:0", []float64{2500, 45000, 40000, 20000}},
		{"ramp down to zero", 3000, "2s:0", []float64{3000}},
		{"step change", 100, "0s:400,1s:400,1s:0", []float64{0, 400, 200}},
		{"odd rates", 7, "1.5s:13,2.25s:1", []float64{15, 15.75}},
		{"idle stage", 0, "1s:0,1s:100", []float64{0, 50}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stages, err := Parse(tt.stages)
			if err != nil {
				t.Fatal(err)
			}
			s, err := New(tt.start, stages)
			if err != nil {
				t.Fatal(err)
			}
			got := all(t, s)
			var at time.Duration
			var sum float64
			for i, st := range stages {
				n := count(got, at, at+st.Duration)
				if math.Abs(float64(n)-tt.want[i]) > 1 {
					t.Errorf("stage %d (%v): %d arrivals, want %v ±1", i, st, n, tt.want[i])
				}
				at += st.Duration
				sum += tt.want[i]
			}
			if math.Abs(float64(len(got))-sum) > 1 {
				t.Errorf("arrivals = %d, want %v ±1", len(got), sum)
			}
			if last := got[len(got)-1]; last > s.Duration() {
				t.Errorf("last arrival at %v, after the schedule's end %v", last, s.Duration())
			}
		})
	}
}

// The gap between arrivals follows the rate: in a ramp from 0 to 8000/s over 10 s,
// arrivals around t are about 1/r(t) apart.
func TestRampSpacing(t *testing.T) {
	s, err := New(0, []Stage{{10 * time.Second, 8000}})
	if err != nil {
		t.Fatal(err)
	}
	got := all(t, s)
	for _, sec := range []time.Duration{2, 5, 9} {
		n := count(got, sec*time.Second, sec*time.Second+100*time.Millisecond)
		want := s.RateAt(sec*time.Second+50*time.Millisecond) / 10
		if math.Abs(float64(n)-want) > 1 {
			t.Errorf("arrivals in [%ds, %ds+100ms) = %d, want %.1f ±1", sec, sec, n, want)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, in := range []string{"", "10s", "x:1", "10s:y", "1s:1,,1s:2"} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = nil error, want one", in)
		}
	}
	bad := []struct {
		name   string
		start  float64
		stages []Stage
	}{
		{"no stages", 1, nil},
		{"only instant stages", 1, []Stage{{0, 5}}},
		{"negative duration", 1, []Stage{{-time.Second, 5}}},
		{"negative rate", 1, []Stage{{time.Second, -5}}},
		{"negative start", -1, []Stage{{time.Second, 5}}},
		{"NaN rate", 1, []Stage{{time.Second, math.NaN()}}},
	}
	for _, b := range bad {
		if _, err := New(b.start, b.stages); err == nil {
			t.Errorf("New(%s) = nil error, want one", b.name)
		}
	}
	if _, err := Constant(10, 0); err == nil {
		t.Error("Constant(10, 0) = nil error, want one")
	}
}

func TestStageString(t *testing.T) {
	st, err := Parse("1m30s:2500.5")
	if err != nil {
		t.Fatal(err)
	}
	if got := st[0].String(); got != "1m30s:2500.5" {
		t.Errorf("String() = %q, want 1m30s:2500.5", got)
	}
}
