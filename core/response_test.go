package core

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
)

func TestResponseEncoding(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []struct {
		name string
		resp Response
	}{
		{"ok, binary body with every byte value", Response{Status: 201, Body: all, BodyKept: true,
			Header: http.Header{"Content-Type": {"application/octet-stream"}}}},
		{"ok, repeated header values keep their order", Response{Status: 200, BodyKept: true, Body: []byte("x"),
			Header: http.Header{"Etag": {`"1"`}, "Content-Language": {"de", "en", "fr"}}}},
		{"ok, body not kept", Response{Status: 202, BodyKept: false}},
		{"ok, no headers, empty body", Response{Status: 204, BodyKept: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encodeResponse(nil, &tt.resp, nil)
			got, err := decodeResponse(b)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tt.resp.Status || got.BodyKept != tt.resp.BodyKept || !bytes.Equal(got.Body, tt.resp.Body) {
				t.Fatalf("got %+v, want %+v", got, tt.resp)
			}
			if len(tt.resp.Header) > 0 && !reflect.DeepEqual(got.Header, tt.resp.Header) {
				t.Fatalf("headers %v, want %v", got.Header, tt.resp.Header)
			}
		})
	}
}

// An allowlisted header is recorded under every spelling the handler gave
// it (w.Header()["ETag"]), canonical first, then in byte order, each with
// its values in order; names that only look alike, and the never-recorded
// headers in any spelling, are not.
func TestRecordedHeaderSpellings(t *testing.T) {
	var c config
	if err := WithRecordedHeaders("ETag", "Content-Language", "Set-Cookie").applyEngine(&c); err != nil {
		t.Fatal(err)
	}
	h := http.Header{
		"ETag": {`"a"`}, "Etag": {`"b"`}, "etag": {`"c"`, `"d"`},
		"content-language": {"fr"},
		"set-cookie":       {"s=1"}, "SET-COOKIE": {"s=2"},
		"E-tag": {"x"}, "Etags": {"y"}, "Kontent-Language": {"z"},
	}
	b := encodeResponse(nil, &Response{Status: 200, Header: h, BodyKept: true}, c.recorded)
	rec, err := parseResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]string
	rec.eachHeader(func(name, value []byte) { got = append(got, [2]string{string(name), string(value)}) })
	want := [][2]string{{"Etag", `"b"`}, {"ETag", `"a"`}, {"etag", `"c"`}, {"etag", `"d"`}, {"content-language", "fr"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("recorded %q, want %q", got, want)
	}
	replay := http.Header{}
	rec.writeHeader(replay, HeaderReplayed)
	if wantH := (http.Header{"Etag": {`"b"`}, "ETag": {`"a"`}, "etag": {`"c"`, `"d"`}, "content-language": {"fr"}, HeaderReplayed: {"true"}}); !reflect.DeepEqual(replay, wantH) {
		t.Fatalf("replayed %v, want %v", replay, wantH)
	}
	if got, want := recordedHeader(h, c.recorded), (http.Header{"Etag": {`"b"`}, "ETag": {`"a"`}, "etag": {`"c"`, `"d"`}, "content-language": {"fr"}}); !reflect.DeepEqual(got, want) {
		t.Fatalf("recordedHeader %v, want %v", got, want)
	}
}

func TestRecordedHeaderNeverRecordsCredentials(t *testing.T) {
	var c config
	if err := WithRecordedHeaders("Set-Cookie", "authorization", "Connection", "X-Request-Id", "content-type").applyEngine(&c); err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Set-Cookie": {"s=1"}, "Authorization": {"Bearer x"}, "Connection": {"close"},
		"X-Request-Id": {"r1"}, "Content-Type": {"text/plain"}, "Location": {"/x"}}
	resp, err := decodeResponse(encodeResponse(nil, &Response{Status: 200, Header: h}, c.recorded))
	if err != nil {
		t.Fatal(err)
	}
	got := resp.Header
	want := http.Header{"X-Request-Id": {"r1"}, "Content-Type": {"text/plain"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("recorded %v, want %v", got, want)
	}
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(nil, &Response{Status: 200, BodyKept: true, Body: []byte("hi"), Header: http.Header{"A": {"b"}}}, nil))
	f.Add([]byte{1, 1, 0, 200, 255, 255, 255, 255, 15})
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := decodeResponse(b)
		if err != nil {
			return
		}
		again, err := decodeResponse(encodeResponse(nil, resp, nil))
		if err != nil || again.Status != resp.Status || !bytes.Equal(again.Body, resp.Body) {
			t.Fatalf("re-encoding changed the response: %v", err)
		}
		// A replay writes the same headers as the decoded response holds.
		rec, _ := parseResponse(b)
		h := http.Header{}
		rec.writeHeader(h, HeaderReplayed)
		if h.Get(HeaderReplayed) != "true" {
			t.Fatalf("replay marker missing: %v", h)
		}
		delete(h, HeaderReplayed)
		if len(h) != len(resp.Header) || (len(h) > 0 && !reflect.DeepEqual(h, resp.Header)) {
			t.Fatalf("writeHeader %v, decoded %v", h, resp.Header)
		}
	})
}

func TestRecorderIgnoresInformationalStatus(t *testing.T) {
	for _, atomic := range []bool{false, true} {
		var rec recorder
		w := httptest.NewRecorder()
		rec.init(w, atomic, 1<<10)
		rec.WriteHeader(http.StatusEarlyHints)
		rec.WriteHeader(http.StatusContinue)
		rec.WriteHeader(http.StatusCreated)
		rec.Write([]byte("x"))
		var resp Response
		rec.response(&resp)
		if resp.Status != http.StatusCreated || string(resp.Body) != "x" || !resp.BodyKept {
			t.Fatalf("atomic=%v: a 1xx must not become the recorded status: %+v", atomic, resp)
		}
		rec.deliver()
		if w.Code != http.StatusCreated {
			t.Fatalf("atomic=%v: delivered %d", atomic, w.Code)
		}
		rec.free()
	}
}

// unwrapOnly exposes Flush only through Unwrap, as many Go 1.20+ middleware
// writers do.
type unwrapOnly struct{ w http.ResponseWriter }

func (u unwrapOnly) Header() http.Header         { return u.w.Header() }
func (u unwrapOnly) Write(b []byte) (int, error) { return u.w.Write(b) }
func (u unwrapOnly) WriteHeader(code int)        { u.w.WriteHeader(code) }
func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.w }

func TestRecorderFlushesThroughUnwrap(t *testing.T) {
	under := httptest.NewRecorder()
	var rec recorder
	rec.init(unwrapOnly{under}, false, 1<<10)
	defer rec.free()
	rec.Write([]byte("chunk"))
	rec.Flush()
	if !under.Flushed || under.Body.String() != "chunk" {
		t.Fatalf("Flush must reach a Flusher behind Unwrap: flushed=%v body=%q", under.Flushed, under.Body)
	}
}

// A replay sets the recorded headers straight into the writer's header
// map: values in order, replacing what the map held under those names,
// every list capped (appending to one never changes another), and with at
// most two allocations whatever the number of headers.
func TestRecordedWriteHeader(t *testing.T) {
	resp := &Response{Status: 201, BodyKept: true, Body: []byte("{}"), Header: http.Header{
		"Content-Type": {"application/json"}, "Content-Language": {"de", "en"}, "X-Custom": {"1"}}}
	b := encodeResponse(nil, resp, []string{"Content-Type", "Content-Language", "X-Custom"})
	rec, err := parseResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"text/plain"}, "Vary": {"Origin"}}
	rec.writeHeader(h, HeaderReplayed)
	want := http.Header{"Content-Type": {"application/json"}, "Content-Language": {"de", "en"}, "X-Custom": {"1"},
		"Vary": {"Origin"}, HeaderReplayed: {"true"}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("header %v, want %v", h, want)
	}
	h["Content-Language"] = append(h["Content-Language"], "fr")
	if got := h["X-Custom"]; len(got) != 1 || got[0] != "1" {
		t.Fatalf("appending to one list changed another: X-Custom %q", got)
	}
	allocs := testing.AllocsPerRun(100, func() {
		h := make(http.Header, 8)
		rec.writeHeader(h, HeaderReplayed)
	})
	// The map (1), the value lists (1), a string per name and per value.
	if want := 2 + float64(2*rec.headers); allocs > want {
		t.Errorf("writeHeader allocates %v times, want at most %v", allocs, want)
	}
}

// An encoding whose values of one name are not consecutive (written with
// a duplicated allowlist by an earlier version) replays every value, in
// order.
func TestWriteHeaderMergesSplitNames(t *testing.T) {
	b := []byte{encPlain, flagKept, 0, 200, 3}
	for _, p := range [][2]string{{"A", "1"}, {"B", "2"}, {"A", "3"}} {
		b = append(b, byte(len(p[0])))
		b = append(b, p[0]...)
		b = append(b, byte(len(p[1])))
		b = append(b, p[1]...)
	}
	b = append(b, 0)
	rec, err := parseResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	rec.writeHeader(h, HeaderReplayed)
	want := http.Header{"A": {"1", "3"}, "B": {"2"}, HeaderReplayed: {"true"}}
	if !reflect.DeepEqual(h, want) {
		t.Fatalf("header %v, want %v", h, want)
	}
	// More than eight names before the repeat.
	b = []byte{encPlain, flagKept, 0, 200, 11}
	for i := range 10 {
		b = append(b, 1, byte('a'+i), 1, byte('0'+i))
	}
	b = append(b, 1, 'a', 1, 'z', 0)
	rec, err = parseResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	h = http.Header{}
	rec.writeHeader(h, HeaderReplayed)
	if got := h["a"]; !reflect.DeepEqual(got, []string{"0", "z"}) {
		t.Fatalf("a: %q, want [0 z]", got)
	}
}

// A duplicated allowlist records each header once.
func TestRecordedHeadersDeduplicated(t *testing.T) {
	var c config
	if err := WithRecordedHeaders("ETag", "Content-Type", "Etag").applyEngine(&c); err != nil {
		t.Fatal(err)
	}
	if want := []string{"Etag", "Content-Type"}; !reflect.DeepEqual(c.recorded, want) {
		t.Fatalf("allowlist %q, want %q", c.recorded, want)
	}
}
