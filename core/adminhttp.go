package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/store"
)

// AdminHandler returns an http.Handler with an operator's operations
// (Records, Record, ResolveRecord, ReleaseRecord), JSON in and out, for
// an admin router. The engine never mounts it: mount it yourself, behind
// the application's own authentication and authorization, since whoever
// reaches it reads recorded responses (which may hold personal data) and
// decides what clients get. Its paths are relative, so strip the prefix
// it is mounted under:
//
//	mux.Handle("/admin/idem/", http.StripPrefix("/admin/idem", requireOperator(e.AdminHandler())))
//
// The operations:
//
//	GET  /records?state=indeterminate&older=5m&limit=100&after=NEXT   an admin.Page
//	GET  /records/{record_id}                                         an admin.Record, with the response
//	POST /records/{record_id}/resolve                                 {"outcome": "applied", "reason": "...",
//	                                                                   "response": {"status": 201, "header": {...}, "body": "..."}}
//	                                                                  the completed admin.Record
//	                                                                  {"outcome": "not_applied", "reason": "..."}: released
//	POST /records/{record_id}/release                                 {"reason": "..."}: released
//
// state is in_progress, completed or indeterminate (the default), older a
// minimum age (a Go duration), after the "next" of the previous page. A
// response's body is "body" (text) or "body_base64" (bytes). POST bodies
// must be application/json (so a cross-site form cannot post one) and
// unknown fields are refused. A released record is answered with
// {"record_id": "...", "state": "absent"}. Errors are problem documents
// (application/problem+json) whose detail is the error's text, for the
// operator: 400 for an invalid request (core.ErrConfig), 404 for a record
// that is not there, 409 for a record that is held by a running attempt,
// completed, or changed since it was read (ErrInProgress, ErrFenced), 503
// when the store fails. Actions are logged as ResolveRecord says; a
// context-aware slog handler can add the operator's identity from the
// request's context.
func (e *Engine) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /records", e.adminList)
	mux.HandleFunc("GET /records/{id}", e.adminShow)
	mux.HandleFunc("POST /records/{id}/resolve", e.adminResolve)
	mux.HandleFunc("POST /records/{id}/release", e.adminRelease)
	return mux
}

// adminResolveRequest is the body of POST /records/{id}/resolve (and,
// with Reason only, of /release).
type adminResolveRequest struct {
	Outcome  string          `json:"outcome"`
	Reason   string          `json:"reason"`
	Response *admin.Response `json:"response"`
}

// adminReleased is the answer to a release.
type adminReleased struct {
	ID    string `json:"record_id"`
	State string `json:"state"`
}

func (e *Engine) adminList(w http.ResponseWriter, r *http.Request) {
	q := admin.Query{After: r.URL.Query().Get("after")}
	var err error
	if s := r.URL.Query().Get("state"); s != "" {
		if q.State, err = store.ParseState(s); err != nil {
			adminError(w, "", err)
			return
		}
	}
	if s := r.URL.Query().Get("older"); s != "" {
		if q.OlderThan, err = time.ParseDuration(s); err != nil || q.OlderThan < 0 {
			adminError(w, "", fmt.Errorf("%w: older=%q is not a duration such as 5m or 1h", ErrConfig, s))
			return
		}
	}
	if s := r.URL.Query().Get("limit"); s != "" {
		if q.Limit, err = strconv.Atoi(s); err != nil || q.Limit < 1 {
			adminError(w, "", fmt.Errorf("%w: limit=%q is not a number from 1 to %d", ErrConfig, s, store.MaxListLimit))
			return
		}
	}
	page, err := e.Records(r.Context(), q)
	if err != nil {
		adminError(w, "", err)
		return
	}
	if page.Records == nil {
		page.Records = []admin.Record{}
	}
	adminJSON(w, http.StatusOK, page)
}

func (e *Engine) adminShow(w http.ResponseWriter, r *http.Request) {
	id, ok := adminID(w, r)
	if !ok {
		return
	}
	info, err := e.Record(r.Context(), id)
	if err != nil {
		adminError(w, id.String(), err)
		return
	}
	adminJSON(w, http.StatusOK, info)
}

func (e *Engine) adminResolve(w http.ResponseWriter, r *http.Request) {
	id, ok := adminID(w, r)
	if !ok {
		return
	}
	var req adminResolveRequest
	if !e.adminBody(w, r, id, &req) {
		return
	}
	res := Resolution{}
	switch req.Outcome {
	case "applied":
		res.Outcome = OutcomeApplied
		if req.Response != nil {
			body := []byte(req.Response.Body)
			if req.Response.BodyBase64 != nil {
				body = req.Response.BodyBase64
			}
			res.Response = &Response{Status: req.Response.Status, Header: req.Response.Header, Body: body, BodyKept: true}
		}
	case "not_applied", "not-applied":
		res.Outcome = OutcomeNotApplied
	default:
		adminError(w, id.String(), fmt.Errorf(`%w: outcome %q: "applied" (with a response) or "not_applied"`, ErrConfig, req.Outcome))
		return
	}
	info, err := e.ResolveRecord(r.Context(), id, res, req.Reason)
	if err != nil {
		adminError(w, id.String(), err)
		return
	}
	if res.Outcome == OutcomeNotApplied {
		adminJSON(w, http.StatusOK, adminReleased{ID: id.String(), State: "absent"})
		return
	}
	adminJSON(w, http.StatusOK, info)
}

func (e *Engine) adminRelease(w http.ResponseWriter, r *http.Request) {
	id, ok := adminID(w, r)
	if !ok {
		return
	}
	var req struct {
		Reason string `json:"reason"`
	}
	if !e.adminBody(w, r, id, &req) {
		return
	}
	if err := e.ReleaseRecord(r.Context(), id, req.Reason); err != nil {
		adminError(w, id.String(), err)
		return
	}
	adminJSON(w, http.StatusOK, adminReleased{ID: id.String(), State: "absent"})
}

// adminID parses the request's {id}, or answers 400.
func adminID(w http.ResponseWriter, r *http.Request) (store.ID, bool) {
	id, err := store.ParseID(r.PathValue("id"))
	if err != nil {
		adminError(w, "", err)
		return store.ID{}, false
	}
	return id, true
}

// adminBody decodes the JSON body of r into v, or answers 400 or 415. The
// body is bounded: a response at the recording cap, in base64, and room
// for the rest.
func (e *Engine) adminBody(w http.ResponseWriter, r *http.Request, id store.ID, v any) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		adminProblem(w, id.String(), http.StatusUnsupportedMediaType, "send the body as application/json")
		return false
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, e.cfg.maxResponse*4/3+1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		adminError(w, id.String(), fmt.Errorf("%w: the body is not the JSON this operation takes: %v", ErrConfig, err))
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		adminError(w, id.String(), fmt.Errorf("%w: the body holds more than one JSON value", ErrConfig))
		return false
	}
	return true
}

// adminError answers err as a problem document whose status follows the
// sentinel it wraps.
func adminError(w http.ResponseWriter, id string, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrConfig):
		status = http.StatusBadRequest
	case errors.Is(err, ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, ErrInProgress), errors.Is(err, ErrFenced):
		status = http.StatusConflict
	case errors.Is(err, ErrStoreUnavailable):
		status = http.StatusServiceUnavailable
	}
	adminProblem(w, id, status, err.Error())
}

func adminProblem(w http.ResponseWriter, id string, status int, detail string) {
	WriteProblem(w, nil, &Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail, RecordID: id})
}

func adminJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		adminProblem(w, "", http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
