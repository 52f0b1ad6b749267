package grpcidem

import (
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idem/core"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRejectionOutcomePending: an effect marked and its answer not
// recorded (core.ErrOutcomePending, over HTTP a 503 outcome-pending with
// Retry-After: retry with the same key) is Unavailable with the reason
// OUTCOME_PENDING and the retry delay, a code gRPC retry policies retry;
// not Internal, which they do not.
func TestRejectionOutcomePending(t *testing.T) {
	st := status.Convert(rejection(&core.RetryError{Err: fmt.Errorf("complete: %w", core.ErrOutcomePending), RetryAfter: time.Second}))
	var reason string
	var delay time.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.Reason
		case *errdetails.RetryInfo:
			delay = d.RetryDelay.AsDuration()
		}
	}
	if st.Code() != codes.Unavailable || reason != "OUTCOME_PENDING" || delay != time.Second {
		t.Errorf("ErrOutcomePending over gRPC: %v %q, reason %q, retry delay %v; want Unavailable, OUTCOME_PENDING, 1s", st.Code(), st.Message(), reason, delay)
	}
}
