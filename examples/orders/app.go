package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem/core"
	"github.com/idemkit/idem/core/store"
	"github.com/idemkit/idem/examples/internal/fakepay"
)

// Order is the orders API's resource.
type Order struct {
	ID        int64     `json:"id"`
	Account   string    `json:"account"`
	Item      string    `json:"item"`
	Quantity  int       `json:"quantity"`
	CreatedAt time.Time `json:"created_at"`
}

// Charge is a payment recorded against an order.
type Charge struct {
	ID               int64     `json:"id"`
	OrderID          int64     `json:"order_id"`
	Account          string    `json:"account"`
	AmountCents      int64     `json:"amount_cents"`
	ProviderChargeID string    `json:"provider_charge_id"`
	CreatedAt        time.Time `json:"created_at"`
}

// repo is the business storage. In atomic mode its writes run on the
// transaction the idempotency middleware began (taken from ctx), so the
// order and the key row commit together.
type repo interface {
	insertOrder(ctx context.Context, o *Order) error
	listOrders(ctx context.Context, account string) ([]Order, error)
	findOrder(ctx context.Context, account string, id int64) (*Order, error)
	// insertCharge records c once per ProviderChargeID; it returns the first.
	insertCharge(ctx context.Context, c *Charge) (*Charge, error)
}

var errNotFound = errors.New("not found")

// app holds the HTTP handlers; they are plain net/http handlers that every
// framework wraps.
type app struct {
	repo      repo
	provider  *fakepay.Provider
	outside   func(ctx context.Context) context.Context // ctx without the attempt's transaction (the store's WithoutTx)
	workDelay time.Duration
}

type accountKey struct{}

// accountFrom is the caller that authorize put in ctx.
func accountFrom(ctx context.Context) string {
	s, _ := ctx.Value(accountKey{}).(string)
	return s
}

func problem(w http.ResponseWriter, status int, slug, detail string) {
	const docs = "https://github.com/idemkit/idem/blob/main/examples/orders/README.md#"
	core.WriteProblem(w, nil, &core.Problem{Type: docs + slug, Title: http.StatusText(status), Status: status, Detail: detail})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// sleep waits d or until ctx ends (the -work-delay flag).
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// createOrder is POST /orders (atomic mode).
func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var in struct {
		Item     string `json:"item"`
		Quantity int    `json:"quantity"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil || strings.TrimSpace(in.Item) == "" || in.Quantity < 1 {
		// Nothing happened (it rolls back): the corrected request may use the key.
		core.Release(ctx)
		detail := `want {"item": non-empty string, "quantity": integer >= 1}`
		if err != nil {
			detail += ": " + err.Error()
		}
		problem(w, http.StatusBadRequest, "invalid-order", detail)
		return
	}
	o := &Order{Account: accountFrom(ctx), Item: in.Item, Quantity: in.Quantity, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if err := a.repo.insertOrder(ctx, o); err != nil {
		problem(w, http.StatusInternalServerError, "internal", "could not store the order")
		return
	}
	if err := sleep(ctx, a.workDelay); err != nil {
		problem(w, http.StatusServiceUnavailable, "cancelled", "the request was cancelled")
		return
	}
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(o.ID, 10))
	writeJSON(w, http.StatusCreated, o)
}

// listOrders is GET /orders.
func (a *app) listOrders(w http.ResponseWriter, r *http.Request) {
	orders, err := a.repo.listOrders(r.Context(), accountFrom(r.Context()))
	if err != nil {
		problem(w, http.StatusInternalServerError, "internal", "could not list orders")
		return
	}
	writeJSON(w, http.StatusOK, orders)
}

// pay is POST /orders/{id}/payments (leased mode): the charge happens at
// an external provider, so the key is claimed and committed first, and the
// provider is called with a downstream key derived from the request's
// identity: a retry that takes over after a crash repeats the call with
// the same key, and the provider answers with the first charge. A failure
// after the call leaves the payment indeterminate (settlePayment settles
// it). The order is read outside the attempt's transaction (a.outside), so
// that it holds no connection, nor SQLite's write lock, while the provider
// works; the charge row is written in it and commits with the record.
func (a *app) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	account := accountFrom(ctx)
	id, err := orderIDFromPath(r.URL.Path)
	if err != nil {
		core.Release(ctx)
		problem(w, http.StatusNotFound, "not-found", "no such order")
		return
	}
	var in struct {
		AmountCents int64 `json:"amount_cents"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.AmountCents < 1 {
		core.Release(ctx)
		problem(w, http.StatusBadRequest, "invalid-payment", `want {"amount_cents": integer >= 1}`)
		return
	}
	if _, err := a.repo.findOrder(a.outside(ctx), account, id); err != nil {
		if errors.Is(err, errNotFound) {
			problem(w, http.StatusNotFound, "not-found", "no such order")
			return
		}
		core.Release(ctx)
		problem(w, http.StatusServiceUnavailable, "unavailable", "could not read the order")
		return
	}
	chargeKey, err := core.DownstreamKey(ctx, "charge")
	if err != nil { // a bug (not the request's context): never charge without a key
		problem(w, http.StatusInternalServerError, "internal", "the payment could not be started")
		return
	}
	core.MarkEffect(ctx) // from here on a failure may have charged the card
	chargeID, err := a.provider.Charge(ctx, chargeKey, fakepay.Charge{Account: account, OrderID: id, AmountCents: in.AmountCents})
	if err != nil {
		problem(w, http.StatusBadGateway, "provider", "the payment provider failed")
		return
	}
	if err := sleep(ctx, a.workDelay); err != nil {
		problem(w, http.StatusServiceUnavailable, "cancelled", "the request was cancelled")
		return
	}
	c, err := a.repo.insertCharge(ctx, &Charge{OrderID: id, Account: account, AmountCents: in.AmountCents,
		ProviderChargeID: chargeID, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)})
	if err != nil {
		problem(w, http.StatusInternalServerError, "internal", "could not record the charge")
		return
	}
	writeJSON(w, http.StatusCreated, c)
}

// settlePayment is the payment route's core.Resolver, which a retry or
// the completer (main.go) asks about a payment left indeterminate: it asks
// the provider about the downstream key. Charged: it records the charge
// from the recorded request (core.RecordRequest: the order in its path,
// the caller, the amount in its body) in the resolver's transaction, which
// commits with the answer, the 201 the handler would have sent. Not
// charged: nothing happened, the key is released and the retry runs.
func (a *app) settlePayment(ctx context.Context, rec store.Record) (core.Resolution, error) {
	pr, err := a.provider.Lookup(ctx, rec.ID.DownstreamKey("charge"))
	if errors.Is(err, fakepay.ErrNoCharge) {
		return core.Resolution{Outcome: core.OutcomeNotApplied}, nil
	}
	if err != nil {
		return core.Resolution{}, fmt.Errorf("asking the provider: %w", err)
	}
	ch := &Charge{ProviderChargeID: pr.ID, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	req, ok := core.ResolvingRequest(ctx)
	if !ok {
		return core.Resolution{}, errors.New("the payment's request was not recorded (core.RecordRequest on the payment route)")
	}
	var in struct {
		AmountCents int64 `json:"amount_cents"`
	}
	if ch.OrderID, err = orderIDFromPath(req.Path); err != nil {
		return core.Resolution{}, fmt.Errorf("the recorded request: %w", err)
	}
	if err := json.Unmarshal(req.Body, &in); err != nil {
		return core.Resolution{}, fmt.Errorf("the recorded request's body: %w", err)
	}
	ch.Account, ch.AmountCents = req.Caller, in.AmountCents
	if ch.Account != pr.Account || ch.OrderID != pr.OrderID || ch.AmountCents != pr.AmountCents {
		return core.Resolution{}, fmt.Errorf("the provider's charge %s (%s, order %d, %d cents) is not the recorded request's (%s, order %d, %d cents): settle it by hand",
			pr.ID, pr.Account, pr.OrderID, pr.AmountCents, ch.Account, ch.OrderID, ch.AmountCents)
	}
	c, err := a.repo.insertCharge(ctx, ch)
	if err != nil {
		return core.Resolution{}, fmt.Errorf("recording the provider's charge: %w", err)
	}
	body, err := json.Marshal(c)
	if err != nil {
		return core.Resolution{}, err
	}
	return core.Resolution{Outcome: core.OutcomeApplied, Response: &core.Response{
		Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
		Body: append(body, '\n'), BodyKept: true, // what writeJSON sends
	}}, nil
}

func orderIDFromPath(p string) (int64, error) {
	rest, ok := strings.CutPrefix(p, "/orders/")
	if !ok {
		return 0, errNotFound
	}
	idText, _, _ := strings.Cut(rest, "/")
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("%w: order id %q", errNotFound, idText)
	}
	return id, nil
}
