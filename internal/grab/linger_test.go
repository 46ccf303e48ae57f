package grab

import "testing"

// TestLingerGain: with CPU to spare a lane lingers while its lingers take
// in at least lingerWorth claims on average, and tries one after
// lingerProbeAfter skipped; short of CPU it always lingers.
func TestLingerGain(t *testing.T) {
	g := lingerGain{mean: lingerWorth}
	if !g.worth(false) {
		t.Fatal("a lane's first linger is not tried")
	}
	g.lingered(0)
	if g.worth(false) {
		t.Fatalf("a linger that took in nothing left the mean at %v: still worth it", g.mean)
	}
	if !g.worth(true) {
		t.Fatal("short of CPU, a lane does not linger")
	}
	for i := 1; i < lingerProbeAfter; i++ {
		g.skipped()
		if g.worth(false) {
			t.Fatalf("worth it after %d skipped, want a probe only after %d", i, lingerProbeAfter)
		}
	}
	g.skipped()
	if !g.worth(false) {
		t.Fatalf("no probe after %d skipped", lingerProbeAfter)
	}
	g.lingered(0) // the probe took in nothing: skip again, from zero
	if g.worth(false) || g.skip != 0 {
		t.Fatalf("after a probe that took in nothing: worth %v, skipped %d; want false, 0", g.worth(false), g.skip)
	}
	g.lingered(3) // a probe that pays: linger again
	if !g.worth(false) {
		t.Fatalf("a linger that took in 3 claims left the mean at %v: not worth it", g.mean)
	}

	// Lingers that take in a claim two times in three stay on; one in
	// three is too few.
	for _, c := range []struct {
		took  []int // what the lingers take in, in turn
		worth bool
	}{{[]int{1, 1, 0}, true}, {[]int{1, 0, 0}, false}} {
		g := lingerGain{mean: lingerWorth}
		for i := range 10 * lingerGainOver * len(c.took) {
			g.lingered(c.took[i%len(c.took)])
			if i >= lingerGainOver*len(c.took) && g.worth(false) != c.worth {
				t.Fatalf("lingers taking in %v in turn: after %d, mean %v, worth %v; want %v", c.took, i+1, g.mean, g.worth(false), c.worth)
			}
		}
	}
}
