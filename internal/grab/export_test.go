package grab

// This file lets the package's external tests (package grab_test, which
// build their services as every other package's tests do, with
// internal/grabtest) look inside a Service. It is compiled into tests only.

// Warm reports whether s's local answers are warm: the known-pools filter
// built, so that it rules out a pool never preloaded.
func Warm(s *Service) bool {
	return s.local.warm.Load() && !s.local.known.MayContain("never-preloaded-anywhere")
}

// HoldersRead reports whether s has read the holders of the sold-out pool.
func HoldersRead(s *Service, poolID string) bool {
	return s.local.holderState(poolID).set.Load() != nil
}

// Breaker is the state of the claim breaker of the named shard (not a
// cluster shard), as it stands: "closed", "open" or "half_open".
func Breaker(s *Service, shard string) string {
	return s.batchers[shard].br.current().String()
}

// UnknownLookups is how many pool ids a second the known-pools filter rules
// out are looked up anyway.
const UnknownLookups = unknownLookups

// WatchesCPU reports whether every lane of s's named shards (not those of
// cluster shards, made the same way by newBatcher) lingers by s's CPU
// watch.
func WatchesCPU(s *Service) bool {
	for _, b := range s.batchers {
		if b.cpu != s.cpu {
			return false
		}
	}
	return s.cpu != nil && len(s.batchers) > 0
}

// SpinCPU keeps the process short of CPU until the func it returns is
// called (or the test ends).
var SpinCPU = spinCPU

// HoldCPU sets the verdict of s's CPU watch, short of CPU or not, for the
// rest of s's life.
func HoldCPU(s *Service, short bool) { s.cpu.hold(short) }

// Queued is how many claims wait in the queue of the named shard's lane
// (not a cluster shard's).
func Queued(s *Service, shard string) int { return len(s.batchers[shard].reqs) }

// SentAt is when the named shard's lane sent its batch out (unix ns), 0
// when none is out. It is cleared before the lane sets what it expects of
// the next batch.
func SentAt(s *Service, shard string) int64 { return s.batchers[shard].sent.Load() }
