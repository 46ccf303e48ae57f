// Package wait is rain's one way to wait: For pauses for a duration unless a
// context ends first, so every loop that backs off or polls stops at once
// when its owner stops it.
package wait

import (
	"context"
	"time"
)

// For waits for d or until ctx ends, whichever comes first. It returns nil
// after d, and ctx's cause (context.Cause) when ctx ended first.
func For(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
