package grpcidem

import (
	"errors"
	"net/http"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem/core"
)

// ErrorDomain is the domain of the errdetails.ErrorInfo every rejection
// carries; its Reason names the rejection (see rejections).
const ErrorDomain = "idem.idemkit.github.com"

// HTTPStatus is the HTTP status whose rule (docs/contract.md, section 4 "Outcomes") applies to
// a handler's gRPC code, and so decides what happens to the record:
//
//   - OK (200) and the client's errors Unauthenticated (401),
//     PermissionDenied (403), NotFound (404), AlreadyExists (409) and
//     FailedPrecondition (412, not the canonical mapping's 400: the
//     system's state refused the call, it was not malformed): recorded and
//     replayed;
//   - InvalidArgument and OutOfRange (400), validation failures: released
//     before core.MarkEffect (execution never began: the corrected call
//     with the same key runs), recorded after it;
//   - ResourceExhausted (429): released before core.MarkEffect (a retry
//     may run), indeterminate after it;
//   - Aborted (503: gRPC says the caller may retry it, so it is never
//     recorded), Unavailable (503), DeadlineExceeded (504), Unimplemented
//     (501), Canceled, Unknown, Internal, DataLoss (500): released, or
//     indeterminate after core.MarkEffect.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.FailedPrecondition:
		return http.StatusPreconditionFailed
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Aborted, codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Unimplemented:
		return http.StatusNotImplemented
	}
	return http.StatusInternalServerError
}

// rejections map the engine's sentinel errors to gRPC codes, in the order
// they are matched. The message is written for the client; the error's own
// text (which may name a database) goes to the engine's log only.
var rejections = []struct {
	err     error
	code    codes.Code
	reason  string
	message string
}{
	{core.ErrMissingKey, codes.InvalidArgument, "MISSING_KEY", "the idempotency-key metadata is required: send a value unique to this operation"},
	{core.ErrInvalidKey, codes.InvalidArgument, "INVALID_KEY", "the idempotency-key metadata must be sent once, 1 to 255 bytes without control characters, raw or as a quoted string"},
	{core.ErrNoCaller, codes.Unauthenticated, "UNAUTHENTICATED", "the caller could not be identified"},
	{core.ErrMismatch, codes.FailedPrecondition, "KEY_REUSED", "this idempotency-key was used for a different request; use a new key for a new operation"},
	{core.ErrInProgress, codes.Aborted, "IN_PROGRESS", "a call with this idempotency-key is still being processed; retry with the same key after the retry delay"},
	{core.ErrLostRace, codes.Aborted, "IN_PROGRESS", "a concurrent call with this idempotency-key was committed first; retry with the same key after the retry delay to get its answer"},
	{core.ErrLeaseLost, codes.Aborted, "LEASE_LOST", "another attempt with this idempotency-key took over; retry with the same key to get its answer"},
	{core.ErrOutcomePending, codes.Unavailable, "OUTCOME_PENDING", "the call may have taken effect and its outcome could not be recorded yet; retry with the same key after the retry delay to get it"},
	{core.ErrTxAborted, codes.Unavailable, "TRANSACTION_ABORTED", "the database aborted this call's transaction, so nothing of it was committed; retry with the same key after the retry delay"},
	{core.ErrStoreUnavailable, codes.Unavailable, "STORE_UNAVAILABLE", "the idempotency store is unavailable; retry with the same key after the retry delay"},
	{core.ErrInvalidRequest, codes.Internal, "INVALID_REQUEST", "the request could not be fingerprinted"},
	{core.ErrNotKept, codes.Internal, "RESPONSE_NOT_KEPT", "the first response was too large to record, so it cannot be replayed"},
	{core.ErrIndeterminate, codes.Internal, "OUTCOME_UNKNOWN", "an earlier attempt with this idempotency-key may have taken effect and its outcome is not known; it is not run again"},
}

// rejection is the gRPC status error for an error of core.Route.Exec:
// its code and message from rejections, an errdetails.ErrorInfo naming
// the reason, and an errdetails.RetryInfo with the retry delay when the
// call may be retried with the same key (in progress, outcome pending, store
// unavailable).
func rejection(err error) error {
	code, reason, msg := codes.Internal, "INTERNAL", "the call could not be completed"
	for _, r := range rejections {
		if errors.Is(err, r.err) {
			code, reason, msg = r.code, r.reason, r.message
			break
		}
	}
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	var re *core.RetryError
	if errors.As(err, &re) && re.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(re.RetryAfter)})
	}
	if withDetails, derr := st.WithDetails(details...); derr == nil {
		st = withDetails
	}
	return st.Err()
}
