package idemclient

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A mutant breaks one rule in the code on purpose: the text from, which
// must occur exactly once in file, becomes to. The cases in fails must then
// fail.
type mutant struct {
	name     string
	file     string
	from, to string
	fails    []string
}

var mutants = []mutant{
	{"KeyPerAttempt", "transport.go",
		"resp, err := t.attempt(req, key, given, n, body, again)",
		"resp, err := t.attempt(req, NewKey(), given, n, body, again)",
		[]string{"SameKeyEveryAttempt", "ErrorCarriesKey", "Concurrent"}},
	{"CallerKeyReplaced", "transport.go",
		"return vs[0], true", "return NewKey(), false",
		[]string{"CallerKeyKept"}},
	{"GetKeyed", "transport.go",
		`case "", http.MethodGet, http.MethodHead`, `case "", http.MethodHead`,
		[]string{"SafeMethodsUntouched"}},
	{"PutNotKeyed", "transport.go",
		`case "", http.MethodGet, http.MethodHead`, `case "", http.MethodPut, http.MethodGet, http.MethodHead`,
		[]string{"NonSafeMethodsKeyed"}},
	{"NetworkErrorNotRetried", "transport.go",
		"if ctx.Err() != nil || permanent(err) {", "if true {",
		[]string{"RetryNetworkError", "CallerKeyKept", "SameKeyEveryAttempt"}},
	{"CancelledAttemptRetried", "transport.go",
		"if ctx.Err() != nil || permanent(err) {", "if permanent(err) {",
		[]string{"ContextEndsDuringAttempt"}},
	{"CertificateRetried", "transport.go",
		"func permanent(err error) bool {", "func permanent(err error) bool {\n\treturn false\n}\n\nfunc permanentOrig(err error) bool {",
		[]string{"CertificateNotRetried"}},
	{"NoAttemptTimeout", "transport.go",
		"if t.cfg.attemptTimeout > 0 {", "if false {",
		[]string{"RetryAttemptTimeout"}},
	{"RetryAfterOptional", "transport.go",
		"if v == \"\" {\n\t\treturn 0, false", "if v == \"\" {\n\t\treturn 0, true",
		[]string{"NoRetryWithoutRetryAfter"}},
	{"RetryAfterIgnored", "transport.go",
		"if wait <= 0 {", "if true {",
		[]string{"RetryAfterSeconds", "RetryAfterDate"}},
	{"RetryAfterDateIgnored", "transport.go",
		"return max(at.Sub(now), 0), true", "return max(at.Sub(at), 0), true",
		[]string{"RetryAfterDate"}},
	{"Retry4xx", "transport.go",
		"case http.StatusBadGateway, http.StatusGatewayTimeout:",
		"case http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusTooManyRequests:",
		[]string{"NoRetry4xx"}},
	{"Retry500", "transport.go",
		"case http.StatusBadGateway, http.StatusGatewayTimeout:",
		"case http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusInternalServerError:",
		[]string{"NoRetry500"}},
	{"ReplayRetried", "transport.go",
		"if Replayed(resp) {", "if false {",
		[]string{"NoRetryReplayed"}},
	{"GatewayNotRetried", "transport.go",
		"case http.StatusBadGateway, http.StatusGatewayTimeout:", "case 0:",
		[]string{"RetryGateway"}},
	{"MaxAttemptsIgnored", "transport.go",
		"n >= t.cfg.maxAttempts", "n >= t.cfg.maxAttempts+1",
		[]string{"MaxAttempts"}},
	{"ZeroRetryAfterHonoured", "transport.go",
		"if wait <= 0 {", "if wait < 0 {",
		[]string{"RetryAfterZero"}},
	{"AttemptsCountedByDefault", "options.go",
		"return config{\n\t\tmaxElapsed:", "return config{\n\t\tmaxAttempts: DefaultMaxAttempts,\n\t\tmaxElapsed:",
		[]string{"OutlastsDefaultLease", "RestartRefused", "MaxElapsedBinds"}},
	{"MaxElapsedIgnored", "transport.go",
		"if end.After(start.Add(t.cfg.maxElapsed)) {", "if false {",
		[]string{"MaxElapsed"}},
	{"DeadlineIgnored", "transport.go",
		"if dl, ok := ctx.Deadline(); ok && end.After(dl) {", "if false {",
		[]string{"ContextDeadline"}},
	{"CancelledWaitIgnored", "transport.go",
		"if err := t.sleep(ctx, wait); err != nil {", "if err := t.sleep(ctx, wait); false && err != nil {",
		[]string{"ContextEndsDuringWait"}},
	{"LastAnswerClosed", "transport.go",
		"\t\tif !t.fits(ctx, start, wait) {", "\t\tif resp != nil {\n\t\t\tdiscard(resp.Body)\n\t\t}\n\t\tif !t.fits(ctx, start, wait) {",
		[]string{"MaxElapsed", "ContextDeadline"}},
	{"NoJitter", "transport.go",
		"return time.Duration(t.jitter(int64(ceil) + 1))", "return ceil",
		[]string{"Backoff"}},
	{"NoCap", "transport.go",
		"ceil = min(ceil, t.cfg.backoffMax)", "_ = 0",
		[]string{"Backoff"}},
	{"GetBodyUnused", "transport.go",
		"return req.Body, req.GetBody, nil", "return req.Body, nil, nil",
		[]string{"GetBodyResent"}},
	{"BodyNotBuffered", "transport.go",
		"case t.cfg.maxBufferedBody == 0:", "case true:",
		[]string{"BufferedBody"}},
	{"BufferLimitIgnored", "transport.go",
		"if int64(len(buf)) > t.cfg.maxBufferedBody {", "if false {",
		[]string{"LongBodySentOnce"}},
	{"ErrorWithoutKey", "transport.go",
		"return nil, &Error{Key: key, Attempts: n, Err: err}\n\t}\n\treturn resp, nil", "return nil, &Error{Attempts: n, Err: err}\n\t}\n\treturn resp, nil",
		[]string{"ErrorCarriesKey"}},
	{"ReplayedAlways", "response.go",
		`return resp != nil && strings.EqualFold(`, `return resp != nil || strings.EqualFold(`,
		[]string{"Replayed"}},
	{"OnRetrySilent", "transport.go",
		"t.cfg.onRetry(retryOf(req, key, n, resp, err, wait))", "_ = retryOf",
		[]string{"OnRetry"}},
	{"AttemptsUncounted", "transport.go",
		"context.WithValue(req.Context(), attemptKey{}, n)", "context.WithValue(req.Context(), attemptKey{}, 1)",
		[]string{"SameKeyEveryAttempt", "MaxAttempts"}},
}

// TestRulesCatchMutants builds a copy of the package for each mutant and
// runs TestRules in it: the mutant's cases must fail and print their rule.
func TestRulesCatchMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and tests a copy of the package per mutant")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	src, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	src = append(src, "go.mod")
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			for _, f := range src {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if f == m.file {
					if n := strings.Count(string(b), m.from); n != 1 {
						t.Fatalf("%q occurs %d times in %s, want once: update the mutant", m.from, n, f)
					}
					b = []byte(strings.Replace(string(b), m.from, m.to, 1))
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.CommandContext(t.Context(), goTool, "test", "-count=1", "-vet=off", "-ldflags=-s -w", "-run", "^TestRules$", ".")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("TestRules passed with the mutant:\n%s", out)
			}
			for _, c := range m.fails {
				if !strings.Contains(string(out), "--- FAIL: TestRules/"+c+" ") {
					t.Errorf("case %s did not fail", c)
				}
			}
			if !strings.Contains(string(out), "rule: ") {
				t.Error("no failing case printed its rule")
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}
