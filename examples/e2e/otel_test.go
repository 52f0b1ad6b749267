package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// otelRequests sends what every -otel test observes: an order (executed),
// its retry (replayed) and the key reused for another order (mismatch).
// -otel is the flag of the OpenTelemetry example (examples/otel), which
// serves the orders example's POST /orders.
func otelRequests(t *testing.T, base string) {
	t.Helper()
	key, body, account := "otel-"+randomHex(8), orderBody("otel-widget", 1), "observer"
	if a := mustDo(t, client, http.MethodPost, base+"/orders", account, key, body); a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("first request: %v, want an executed 201", a)
	}
	if a := mustDo(t, client, http.MethodPost, base+"/orders", account, key, body); a.status != http.StatusCreated || !a.replayed() {
		t.Fatalf("retry: %v, want a replayed 201", a)
	}
	if a := mustDo(t, client, http.MethodPost, base+"/orders", account, key, orderBody("otel-other", 2)); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("changed body: %v, want 422", a)
	}
}

// wantDecisions is what otelRequests leaves in idem.decisions.
var wantDecisions = map[string]int64{"executed": 1, "replayed": 1, "mismatch": 1}

// TestOTelStdout: -otel stdout writes otelidem's metrics (at shutdown, the
// interval being an hour) and every request's span with its idem.decision
// event, as JSON on standard output.
func TestOTelStdout(t *testing.T) {
	c := config{otel: true, extra: []string{"-otel", "stdout", "-otel-interval", "1h"}}
	s := startServer(t, "otel-stdout", c)
	otelRequests(t, "http://"+s.addr)
	if code := s.terminate(t); code != 0 {
		t.Fatalf("exit code after SIGTERM: %d, want 0", code)
	}

	type kv struct {
		Key   string
		Value struct{ Value any }
	}
	attr := func(attrs []kv, key string) any {
		for _, a := range attrs {
			if a.Key == key {
				return a.Value.Value
			}
		}
		return nil
	}
	// The stream holds one JSON object per span and one per metrics
	// export.
	var record struct {
		SpanContext *json.RawMessage
		Events      []struct {
			Name       string
			Attributes []kv
		}
		ScopeMetrics []struct {
			Scope   struct{ Name string }
			Metrics []struct {
				Name string
				Data struct {
					DataPoints []struct {
						Attributes []kv
						Value      float64 // sums
						Count      uint64  // histograms
					}
				}
			}
		}
	}
	events := map[string]int64{}    // idem.decision span events, by decision
	decisions := map[string]int64{} // the last idem.decisions export
	claims := uint64(0)             // idem.claim.duration's count
	spans, exports := 0, 0
	out := s.out.Bytes()
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		record.SpanContext, record.Events, record.ScopeMetrics = nil, nil, nil
		if err := dec.Decode(&record); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("standard output is not a stream of JSON objects: %v\n%s", err, out)
		}
		if record.SpanContext != nil {
			spans++
		}
		for _, ev := range record.Events {
			if ev.Name != "idem.decision" {
				continue
			}
			d, _ := attr(ev.Attributes, "idem.decision").(string)
			events[d]++
			if scope, route := attr(ev.Attributes, "idem.scope"), attr(ev.Attributes, "idem.route"); scope != "" || route != "/orders" {
				t.Errorf("span event %s: idem.scope %v, idem.route %v; want the empty scope and the route /orders", d, scope, route)
			}
			if attr(ev.Attributes, "idem.record_id") == nil {
				t.Errorf("span event %s has no idem.record_id", d)
			}
		}
		for _, sm := range record.ScopeMetrics {
			if sm.Scope.Name != "github.com/idemkit/idem/otelidem" {
				continue
			}
			exports++
			clear(decisions)
			for _, m := range sm.Metrics {
				for _, dp := range m.Data.DataPoints {
					d, _ := attr(dp.Attributes, "idem.decision").(string)
					switch m.Name {
					case "idem.decisions":
						decisions[d] += int64(dp.Value)
					case "idem.claim.duration":
						claims += dp.Count
					}
				}
			}
		}
	}
	if spans != 3 {
		t.Errorf("spans on standard output: %d, want 3 (one per request)\n%s", spans, out)
	}
	if !maps.Equal(events, wantDecisions) {
		t.Errorf("idem.decision span events: %v, want %v", events, wantDecisions)
	}
	if exports == 0 {
		t.Fatalf("no export of otelidem's metrics on standard output:\n%s", out)
	}
	if !maps.Equal(decisions, wantDecisions) {
		t.Errorf("idem.decisions: %v, want %v", decisions, wantDecisions)
	}
	if claims != 3 {
		t.Errorf("idem.claim.duration count: %d, want 3 (every decision reached the store)", claims)
	}
}

// TestOTelPrometheus: -otel prometheus serves otelidem's metrics on GET
// /metrics, under the Prometheus exporter's names.
func TestOTelPrometheus(t *testing.T) {
	c := config{otel: true, extra: []string{"-otel", "prometheus"}}
	s := startServer(t, "otel-prometheus", c)
	base := "http://" + s.addr
	otelRequests(t, base)
	m := mustDo(t, client, http.MethodGet, base+"/metrics", "", "", "")
	if m.status != http.StatusOK {
		t.Fatalf("GET /metrics: %v", m)
	}
	re := regexp.MustCompile(`(?m)^idem_decisions_total\{(.*)\} (\d+)$`)
	got := map[string]int64{}
	for _, line := range re.FindAllStringSubmatch(string(m.body), -1) {
		labels := line[1]
		d := regexp.MustCompile(`idem_decision="([a-z_]+)"`).FindStringSubmatch(labels)
		if d == nil || !strings.Contains(labels, `idem_route="/orders"`) {
			t.Errorf("idem_decisions_total without its labels: %s", line[0])
			continue
		}
		n, _ := strconv.ParseInt(line[2], 10, 64)
		got[d[1]] += n
	}
	if !maps.Equal(got, wantDecisions) {
		t.Errorf("idem_decisions_total: %v, want %v\n%s", got, wantDecisions, m.body)
	}
	if !regexp.MustCompile(`(?m)^idem_claim_duration_seconds_count\{.*idem_decision="executed".*\} 1$`).Match(m.body) {
		t.Errorf("GET /metrics has no idem_claim_duration_seconds_count of the executed request:\n%s", m.body)
	}
	if code := s.terminate(t); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	if out := s.out.Bytes(); len(out) > 0 {
		t.Errorf("-otel prometheus wrote on standard output:\n%s", out)
	}
}

// TestOTelOff: the orders service, and the OpenTelemetry example by
// default, have no telemetry: no /metrics, nothing on standard output.
func TestOTelOff(t *testing.T) {
	for name, c := range map[string]config{
		"orders": {framework: "echo", store: "sql", db: newDatabase(t, "sqlite")},
		"otel":   {otel: true},
	} {
		t.Run(name, func(t *testing.T) { testOTelOff(t, name, c) })
	}
}

func testOTelOff(t *testing.T, name string, c config) {
	s := startServer(t, name+"-otel-off", c)
	base := "http://" + s.addr
	otelRequests(t, base)
	if m := mustDo(t, client, http.MethodGet, base+"/metrics", "", "", ""); m.status != http.StatusNotFound {
		t.Errorf("GET /metrics without -otel: %v, want 404", m)
	}
	if code := s.terminate(t); code != 0 {
		t.Errorf("exit code after SIGTERM: %d, want 0", code)
	}
	if out := s.out.Bytes(); len(out) > 0 {
		t.Errorf("without -otel the service wrote on standard output:\n%s", out)
	}
}
