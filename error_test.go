package rain

import (
	"errors"
	"fmt"
	"testing"
)

// TestClientText: what a client reads of an error is its code and its
// reason, never its cause (a shard's error, with its address); the whole
// error, for logs, has all three, and errors.Is sees the code and the
// cause.
func TestClientText(t *testing.T) {
	cause := errors.New("dial tcp 10.0.0.5:6379: connection refused")
	down := Errorf(ErrUnavailable, cause, "shard %s did not answer", "s2")
	for _, c := range []struct {
		name      string
		err       error
		client    string
		whole     string
		is, notIs error
	}{
		{"unavailable", down, "unavailable: shard s2 did not answer",
			"catalog: unavailable: shard s2 did not answer: dial tcp 10.0.0.5:6379: connection refused", cause, ErrNotFound},
		{"wrapped again", fmt.Errorf("preload p: %w", down), "unavailable: shard s2 did not answer",
			"preload p: catalog: unavailable: shard s2 did not answer: dial tcp 10.0.0.5:6379: connection refused", ErrUnavailable, ErrInvalid},
		{"not now says why not", Errorf(ErrNotNow, nil, "pool %s cannot close: %s", "p", "sub-pool 0: 1 grants held"),
			"pool p cannot close: sub-pool 0: 1 grants held", "catalog: not now: pool p cannot close: sub-pool 0: 1 grants held", ErrNotNow, ErrConflict},
		{"readable cause", readable(ErrInvalid, errors.New("count must be positive")), "invalid: count must be positive",
			"catalog: invalid: count must be positive", ErrInvalid, ErrUnavailable},
		{"bare code", ErrNotFound, "no such pool", "catalog: no such pool", ErrNotFound, ErrNoGrant},
		{"no code", cause, "", cause.Error(), cause, ErrUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := ClientText(c.err); got != c.client {
				t.Errorf("ClientText = %q, want %q", got, c.client)
			}
			if got := c.err.Error(); got != c.whole {
				t.Errorf("Error() = %q, want %q", got, c.whole)
			}
			if !errors.Is(c.err, c.is) || errors.Is(c.err, c.notIs) {
				t.Errorf("errors.Is(%v, %v) = false or errors.Is(_, %v) = true", c.err, c.is, c.notIs)
			}
		})
	}
}
