package store

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/errconfig"
)

// ParseID parses the hex form of a record ID (ID.String, the record_id of
// every problem document and the "id" of the engine's log lines). It
// accepts upper and lower case, and fails with an error wrapping core.ErrConfig
// on anything but 64 hex digits.
func ParseID(s string) (ID, error) {
	var id ID
	s = strings.TrimSpace(s)
	if len(s) != 2*len(id) {
		return ID{}, fmt.Errorf("%w: a record id is %d hex digits (the record_id of a problem document), not %d characters", errconfig.Err, 2*len(id), len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return ID{}, fmt.Errorf("%w: a record id is %d hex digits (the record_id of a problem document): %v", errconfig.Err, 2*len(id), err)
	}
	return id, nil
}

// ParseState parses the name of a state (State.String): "in_progress",
// "completed" or "indeterminate"; anything else fails with an error
// wrapping core.ErrConfig.
func ParseState(s string) (State, error) {
	for _, st := range [...]State{StateInProgress, StateCompleted, StateIndeterminate} {
		if s == st.String() {
			return st, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown state %q: in_progress, completed or indeterminate", errconfig.Err, s)
}

// Check reports whether q is a query that Inspector.List answers: a State
// of the three, and a Limit of 1 to MaxListLimit. Its error wraps
// core.ErrConfig. Stores call it first.
func (q ListQuery) Check() error {
	switch q.State {
	case StateInProgress, StateCompleted, StateIndeterminate:
	default:
		return fmt.Errorf("%w: List: state %d is not in_progress, completed or indeterminate", errconfig.Err, q.State)
	}
	if q.Limit < 1 || q.Limit > MaxListLimit {
		return fmt.Errorf("%w: List: limit %d is not between 1 and %d", errconfig.Err, q.Limit, MaxListLimit)
	}
	return nil
}

// String returns the text form of c (empty for the zero Cursor): the
// creation time in Unix nanoseconds and the ID, "1767225600000000000.<64
// hex digits>". It is meant to be handed back, not read.
func (c Cursor) String() string {
	if c.IsZero() {
		return ""
	}
	return strconv.FormatInt(c.CreatedAt.UnixNano(), 10) + "." + c.ID.String()
}

// ParseCursor parses the text form of a Cursor (Cursor.String); the empty
// string is the zero Cursor. Anything else fails with an error wrapping
// core.ErrConfig.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	ns, hexID, ok := strings.Cut(s, ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return Cursor{}, fmt.Errorf("%w: malformed cursor %q (pass the \"next\" of the previous page as it is)", errconfig.Err, s)
	}
	id, err := ParseID(hexID)
	if err != nil {
		return Cursor{}, fmt.Errorf("%w: malformed cursor %q (pass the \"next\" of the previous page as it is)", errconfig.Err, s)
	}
	return Cursor{CreatedAt: time.Unix(0, n).UTC(), ID: id}, nil
}
