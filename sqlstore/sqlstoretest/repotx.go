package sqlstoretest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// repositoryTransaction: a repository that opens its own transaction with
// the request's context (Fixture.RepoTx) joins the request's as a
// savepoint, as GORM joins a nested transaction (issue 26, item 3): a
// repository transaction that commits keeps its row with the request's; one
// that rolls back loses its row alone, and the handler's 201 after it is
// recorded with the rest; a 5xx after a committed repository transaction
// rolls everything back and the retry runs. Before, GORM refused such a
// transaction (ErrOutsideTx), and a database/sql repository's committed on
// its own, whatever the request's outcome.
func (h *harness) repositoryTransaction(t *testing.T) {
	f, ctx := h.cfg.New(t), ctxT(t)
	if f.RepoTx == nil {
		t.Log("the store offers no join of a repository's own transaction")
		return
	}
	e := quietEngine(t, f)
	runs := 0
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", e.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		ctx, item := r.Context(), r.URL.Query().Get("item")
		if err := f.Insert(ctx, item+"-handler"); err != nil {
			http.Error(w, "handler insert: "+err.Error(), http.StatusTeapot)
			return
		}
		if err := f.RepoTx(ctx, item+"-committed", true); err != nil {
			http.Error(w, "repository transaction that commits: "+err.Error(), http.StatusTeapot)
			return
		}
		if err := f.RepoTx(ctx, item+"-rolled-back", false); err != nil {
			http.Error(w, "repository transaction that rolls back: "+err.Error(), http.StatusTeapot)
			return
		}
		if err := f.Insert(ctx, item+"-after"); err != nil {
			http.Error(w, "handler insert after the repository: "+err.Error(), http.StatusTeapot)
			return
		}
		status := http.StatusCreated
		if r.URL.Query().Get("fail") != "" {
			status = http.StatusInternalServerError
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"run":%d}`, runs)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	counts := func(item string) string {
		return fmt.Sprintf("handler %d, committed %d, rolled back %d, after %d",
			f.Count(t, item+"-handler"), f.Count(t, item+"-committed"), f.Count(t, item+"-rolled-back"), f.Count(t, item+"-after"))
	}

	item := "repo-" + Table()[len("idem_t_"):]
	first := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if first.err != nil || first.status != http.StatusCreated {
		t.Fatalf("first request: %v, want 201", first)
	}
	if got, want := counts(item), "handler 1, committed 1, rolled back 0, after 1"; got != want {
		t.Fatalf("rows: %s, want %s", got, want)
	}
	again := post(ctx, srv.Client(), srv.URL+"/transfers?item="+item, item, `{}`)
	if again.err != nil || !again.replayed || string(again.body) != string(first.body) || runs != 1 {
		t.Fatalf("retry: %v (runs %d), want the 201 replayed", again, runs)
	}

	item = "repo-fail-" + Table()[len("idem_t_"):]
	failed := post(ctx, srv.Client(), srv.URL+"/transfers?fail=1&item="+item, item, `{}`)
	if failed.err != nil || failed.status != http.StatusInternalServerError {
		t.Fatalf("a 5xx after the repository committed: %v, want the handler's 500", failed)
	}
	if got, want := counts(item), "handler 0, committed 0, rolled back 0, after 0"; got != want {
		t.Fatalf("rows after the 5xx: %s, want %s (the repository's commit was a savepoint of the rolled-back request)", got, want)
	}
}
