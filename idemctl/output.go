package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/core/admin"
	"github.com/idemkit/idem/core/store"
)

// printList writes a page of records as a table, one record a line.
func printList(w io.Writer, page admin.Page, st store.State, older time.Duration, now time.Time) {
	if len(page.Records) == 0 {
		what := st.String() + " records"
		if older > 0 {
			what += " older than " + older.String()
		}
		fmt.Fprintf(w, "no %s\n", what)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RECORD_ID\tSTATE\tAGE\tATTEMPT\tSTATUS\tLEASE\tSCOPE\tKEY")
	for _, r := range page.Records {
		status := "-"
		if r.Status != 0 {
			status = fmt.Sprint(r.Status)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.State, age(now.Sub(r.CreatedAt)), r.Attempt, status, lease(r, now), r.Scope, r.Key)
	}
	_ = tw.Flush()
}

// lease describes a record's lease in a few characters.
func lease(r admin.Record, now time.Time) string {
	switch {
	case r.LeaseUntil == nil:
		return "-"
	case r.LeaseLapsed:
		return "lapsed " + age(now.Sub(*r.LeaseUntil)) + " ago"
	}
	return "runs " + age(r.LeaseUntil.Sub(now))
}

// age rounds d for a person: seconds under a minute, then minutes, hours
// and days.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// printRecord writes one record, field by field, with its response.
func printRecord(w io.Writer, r admin.Record, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	field := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{name}, args...)...)
	}
	field("record_id", "%s", r.ID)
	field("state", "%s", r.State)
	field("why", "%s", r.Why)
	field("caller", "%s", r.Caller)
	field("scope", "%s", r.Scope)
	field("key", "%s", r.Key)
	field("attempt", "%d", r.Attempt)
	field("created", "%s (%s ago)", r.CreatedAt.Format(time.RFC3339), age(now.Sub(r.CreatedAt)))
	if r.LeaseUntil != nil {
		field("lease", "%s (%s)", r.LeaseUntil.Format(time.RFC3339), lease(r, now))
	}
	field("expires", "%s (in %s)", r.ExpiresAt.Format(time.RFC3339), age(r.ExpiresAt.Sub(now)))
	if r.Fingerprint != "" {
		field("fingerprint", "%s", r.Fingerprint)
	}
	switch {
	case r.ResponseError != "":
		field("response", "cannot be read here: %s", r.ResponseError)
	case r.Response != nil:
		field("response", "%d", r.Response.Status)
		names := make([]string, 0, len(r.Response.Header))
		for name := range r.Response.Header {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			for _, v := range r.Response.Header[name] {
				field("  header", "%s: %s", name, v)
			}
		}
		switch {
		case !r.Response.BodyKept:
			field("  body", "not recorded (too large, or streamed)")
		case r.Response.BodyBase64 != nil:
			field("  body", "%d bytes, not text (use -json: body_base64)", len(r.Response.BodyBase64))
		default:
			field("  body", "%s", strings.TrimRight(r.Response.Body, "\n"))
		}
	}
	_ = tw.Flush()
}
