package grab

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// replyErr is a server's error answer, as go-redis hands it over.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestClaimOutcome: a claim whose batch never left is unavailable, as is
// one a server refused; one whose answer was lost, or whose last retry met
// an answer go-redis retries on (an earlier try may have run), has an
// unknown outcome: the user must not be told nothing was granted.
func TestClaimOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("%w: breaker open", errNotSent), ErrUnavailable},
		{replyErr("ERR Error running script"), ErrUnavailable},
		{replyErr("NOSCRIPT No matching script"), ErrUnavailable},
		{replyErr("LOADING Redis is loading the dataset in memory"), ErrOutcomeUnknown},
		{replyErr("READONLY You can't write against a read only replica."), ErrOutcomeUnknown},
		{replyErr("MASTERDOWN Link with MASTER is down"), ErrOutcomeUnknown},
		{replyErr("CLUSTERDOWN The cluster is down"), ErrOutcomeUnknown},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), ErrOutcomeUnknown},
		{replyErr("ERR max number of clients reached"), ErrOutcomeUnknown},
		{replyErr("NOREPLICAS Not enough good replicas to write."), ErrOutcomeUnknown},
		{context.DeadlineExceeded, ErrOutcomeUnknown},
		{errors.New("read tcp: connection reset by peer"), ErrOutcomeUnknown},
	} {
		if got := claimOutcome(tc.err); got != tc.want {
			t.Errorf("claimOutcome(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
