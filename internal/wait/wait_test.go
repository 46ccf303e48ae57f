package wait

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFor(t *testing.T) {
	if err := For(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("For(1ms) = %v, want nil", err)
	}
	cause := errors.New("stopped")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	// An hour's wait that returns at all returned for the context.
	if err := For(ctx, time.Hour); !errors.Is(err, cause) {
		t.Fatalf("For on an ended context = %v, want its cause", err)
	}
}
