package idempotency

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

func str(s string) *string { return &s }

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

func decodeProblem(t *testing.T, r *Response) problemBody {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problemBody
	if err := json.Unmarshal(r.Body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.Body, err)
	}
	if p.Status != r.Status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v does not match status %d", p, r.Status)
	}
	return p
}

// StoredHeaders: the Content-Type apart, the per-connection headers left out, the allow-list (case-insensitive),
// repeated headers joined.
func TestStoredHeaders(t *testing.T) {
	h := http.Header{"Content-Type": {"text/plain"}, "Set-Cookie": {"a=b"}, "Date": {"x"}, "Content-Length": {"3"},
		"Connection": {"close"}, BodyEncodingHeader: {"text"}, ReplayedHeader: {"true"}, "Location": {"/p/1"},
		"Vary": {"A", "B"}, "x-trace": {"t"}}
	for _, tc := range []struct {
		allow       []string
		contentType any
		headers     string
	}{
		{nil, "text/plain", `{"Location":"/p/1","Vary":"A, B","X-Trace":"t"}`},
		{[]string{"LOCATION", "x-TRACE", "date"}, nil, `{"Location":"/p/1","X-Trace":"t"}`},
		{[]string{}, nil, `{}`},
	} {
		if ct, headers := StoredHeaders(h, tc.allow); ct != tc.contentType || headers != tc.headers {
			t.Errorf("allow %v: %v %s, want %v %s", tc.allow, ct, headers, tc.contentType, tc.headers)
		}
	}
}

func TestValidRequestBody(t *testing.T) {
	for body, want := range map[string]bool{
		`{"amount_cents": 100, "currency": "USD"}`: true,
		`[1, 2]`:            true,
		`"x"`:               true,
		`{"a": "\\u0000"}`:  true, // an escaped backslash, then the text u0000
		``:                  false,
		`{"a": 1`:           false,
		`not json`:          false,
		`{"a": "\u0000"}`:   false, // jsonb refuses the NUL escape
		`{"\u0000": 1}`:     false,
		"{\"a\": \"\xff\"}": false, // invalid UTF-8
		`{"a": NaN}`:        false,
		`{"a": 1} {"b": 2}`: false,
	} {
		if got := ValidRequestBody([]byte(body)); got != want {
			t.Errorf("ValidRequestBody(%q) = %v, want %v", body, got, want)
		}
	}
}

func TestProblem(t *testing.T) {
	p := Problem("", 400, "idempotency-key-missing", "Idempotency-Key required", "send one")
	got := decodeProblem(t, p)
	if got.Type != "https://idempotency.dev/problems/idempotency-key-missing" || got.Status != 400 {
		t.Fatalf("%+v", got)
	}
	w := httptest.NewRecorder()
	p.Write(w)
	if w.Code != 400 || w.Header().Get("Content-Length") != "" && w.Header().Get("Content-Length") != strconv.Itoa(len(p.Body)) {
		t.Fatalf("written %d %v", w.Code, w.Header())
	}
	if !strings.Contains(w.Body.String(), `"status":400`) {
		t.Fatalf("body %q", w.Body.String())
	}
}

func TestRecorder(t *testing.T) {
	rec := NewRecorder()
	rec.Header().Set("X-A", "1")
	_, _ = rec.Write([]byte("hi"))
	rec.WriteHeader(500) // too late: the status was 200 from the first Write
	r := rec.Response()
	if r.Status != 200 || string(r.Body) != "hi" || r.Header.Get("X-A") != "1" || r.Header.Get("Content-Type") == "" {
		t.Fatalf("%+v", r)
	}
	if r := NewRecorder().Response(); r.Status != 200 || len(r.Body) != 0 {
		t.Fatalf("%+v", r)
	}
}

// idem_claim_request's value, in its text form, to the answer (ClaimResponse): the record's quoting, NULL fields, the bytea body, keys stored through
// the jsonb completion of 1.0-1.2 (a JSON body; a text or base64 body in a JSON string, the encoding in a stored
// header), the problems of a mismatch (its status configurable, 422 without one) and of a key in progress.
// claimValue is idem_request_claim in binary, as the server sends it: fields of nil (NULL), string (text, or jsonb
// for the fourth), int (int4) or []byte (bytea).
func claimValue(fields ...any) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(fields)))
	for i, f := range fields {
		b = binary.BigEndian.AppendUint32(b, claimFieldTypes[i%5])
		var v []byte
		switch f := f.(type) {
		case nil:
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		case int:
			v = binary.BigEndian.AppendUint32(nil, uint32(f))
		case string:
			v = []byte(f)
			if claimFieldTypes[i%5] == oidJSONB {
				v = append([]byte{1}, f...)
			}
		case []byte:
			v = f
		}
		b = append(binary.BigEndian.AppendUint32(b, uint32(len(v))), v...)
	}
	return b
}

// claimResponse is the answer to a claim's binary value.
func claimResponse(base string, value []byte) (*Response, error) {
	c, err := decodeClaim(value)
	if err != nil {
		return nil, err
	}
	return ClaimResponse(base, c)
}

func TestClaimResponse(t *testing.T) {
	for _, tc := range []struct {
		name                                      string
		value                                     []byte
		status, slug, contentType, location, body string
	}{
		{"claimed", claimValue("claimed", nil, nil, nil, nil), "", "", "", "", ""},
		{"replay", claimValue("replay", 201, "application/json", `{"Location": "/p/1"}`, []byte(`{"a":1}`)), "201", "",
			"application/json", "/p/1", `{"a":1}`},
		{"no body", claimValue("replay", 204, nil, nil, nil), "204", "", "", "", ""},
		{"bytes", claimValue("replay", 200, "application/octet-stream", `{}`, []byte("\\x00\\\x00\xff\n")), "200", "",
			"application/octet-stream", "", "\\x00\\\x00\xff\n"},
		{"1.2 JSON", claimValue("replay", 402, nil, "{}", []byte(`{"e":1}`)), "402", "", "", "", `{"e":1}`},
		{"1.2 text", claimValue("replay", 200, nil, `{"Content-Type": "text/plain", "Idempotency-Body-Encoding": "text"}`,
			[]byte(`"hi, \"you\""`)), "200", "", "text/plain", "", `hi, "you"`},
		{"1.2 base64", claimValue("replay", 200, nil, `{"Idempotency-Body-Encoding": "base64"}`, []byte(`"AP8="`)), "200",
			"", "", "", "\x00\xff"},
		{"mismatch", claimValue("mismatch", 422, nil, nil, nil), "422", "idempotency-key-reused", "application/problem+json", "", ""},
		{"mismatch 400", claimValue("mismatch", 400, nil, nil, nil), "400", "idempotency-key-reused", "application/problem+json", "", ""},
		{"mismatch, no status", claimValue("mismatch", nil, nil, nil, nil), "422", "idempotency-key-reused", "application/problem+json", "", ""},
		{"in progress", claimValue("in_progress", 409, nil, nil, nil), "409", "idempotency-key-in-progress", "application/problem+json", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := claimResponse("", tc.value)
			if err != nil || (r == nil) != (tc.status == "") {
				t.Fatalf("%s: %+v %v", tc.name, r, err)
			} else if r == nil {
				return
			}
			if strconv.Itoa(r.Status) != tc.status || r.Header.Get("Content-Type") != tc.contentType ||
				r.Header.Get("Location") != tc.location || (tc.slug == "" && string(r.Body) != tc.body) ||
				r.Header.Get(BodyEncodingHeader) != "" || r.Header.Get(ReplayedHeader) != map[bool]string{true: "true"}[tc.slug == ""] {
				t.Errorf("%s: %d %v %q", tc.name, r.Status, r.Header, r.Body)
			}
			if tc.slug != "" && decodeProblem(t, r).Type != DefaultProblemBase+tc.slug ||
				r.Header.Get("Retry-After") != map[bool]string{true: "1"}[tc.slug == "idempotency-key-in-progress"] {
				t.Errorf("%s: problem %s, Retry-After %q", tc.name, r.Body, r.Header.Get("Retry-After"))
			}
		})
	}
	// Not a composite of five fields, cut short, trailing bytes, a field of another type, a jsonb of another
	// version; an outcome or stored headers or a body encoding no one knows, a replay without a status.
	good := claimValue("replay", 200, nil, "{}", []byte("x"))
	wrongType := append([]byte{}, good...)
	wrongType[4+3] = 26 // the outcome as oid 26
	oldJSONB := claimValue("replay", 200, nil, "{}", []byte("x"))
	oldJSONB[4+(8+6)+(8+4)+8+8] = 2 // the headers' version byte (after "replay", 200 and a NULL)
	for name, bad := range map[string][]byte{"empty": nil, "4 fields": claimValue("replay", 200, nil, "{}"),
		"cut short": good[:len(good)-1], "trailing": append(append([]byte{}, good...), 0), "field type": wrongType,
		"jsonb version": oldJSONB, "outcome": claimValue("bogus", nil, nil, nil, nil), "no outcome": claimValue(nil, 200, nil, nil, nil),
		"no status": claimValue("replay", nil, nil, nil, nil), "headers": claimValue("replay", 200, nil, "[1]", nil),
		"encoding": claimValue("replay", 200, nil, `{"Idempotency-Body-Encoding": "rot13"}`, []byte("1"))} {
		if _, err := claimResponse("", bad); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := claimResponse("", good); err != nil {
		t.Errorf("good: %v", err)
	}
}

// The claim's text form (the simple protocol behind a pooler): a record literal whose body is bytea's text in
// either bytea_output form, hex or escape, read to the same bytes.
func TestDecodeClaimText(t *testing.T) {
	body := "\x00\\x41\\\\\xff\xfe\n\"'(),"
	for _, tc := range []struct{ value, body string }{
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","\\x7b2261223a317d")`, `{"a":1}`},
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","{""a"":1}")`, `{"a":1}`},
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","\\x005c7834315c5cfffe0a222728292c")`, body},
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","\\000\\\\x41\\\\\\\\\\377\\376\\012""'(),")`, body},
	} {
		c, err := decodeClaimText(tc.value)
		if err != nil || c.Outcome != "replay" || *c.HTTPStatus != 201 || *c.ContentType != "application/json" ||
			*c.ResponseHeaders != `{"Location": "/p/1"}` || *c.ResponseBody != tc.body {
			t.Errorf("%s: %+v %v", tc.value, c, err)
		}
	}
	if c, err := decodeClaimText(`(claimed,,,,)`); err != nil || c.Outcome != "claimed" || c.HTTPStatus != nil || c.ResponseBody != nil {
		t.Errorf("claimed: %+v %v", c, err)
	}
	for _, bad := range []string{``, `(replay`, `("a)`, `(a,b)`, `(replay,x,,,)`, `(replay,200,,,"\\xZZ")`,
		`(replay,200,,,"\\9")`, `(replay,200,,,"\\")`, `(replay,200,,,"\\48")`} {
		if _, err := decodeClaimText(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// RedactJSON drops the members its pointers name (RFC 6901, ~0 and ~1 escapes, through arrays by index), keeps
// the rest in order, reports the pointers dropped in the order given, and leaves anything but an object alone.
func TestRedactJSON(t *testing.T) {
	for _, tc := range []struct {
		body     string
		pointers []string
		want     string
		dropped  string
	}{
		{`{"a": 1, "b": {"c": 2, "d": 3}}`, []string{"/b/c", "/a"}, `{"b": {"d": 3}}`, "/b/c,/a"},
		{`{"a": 1}`, []string{"/x", "/a/b", "", "a"}, `{"a": 1}`, ""},
		{`{"x/y": 1, "m~n": 2, "k": 3}`, []string{"/x~1y", "/m~0n"}, `{"k": 3}`, "/x~1y,/m~0n"},
		{`{"items": [{"s": 1, "t": 2}, {"s": 3}]}`, []string{"/items/1/s", "/items/01/s", "/items/0"}, `{"items": [{"s":1,"t":2},{}]}`, "/items/1/s"},
		{`[{"a": 1}]`, []string{"/0/a"}, `[{"a": 1}]`, ""},
		{`not json`, []string{"/a"}, `not json`, ""},
	} {
		got, dropped := RedactJSON([]byte(tc.body), tc.pointers)
		if string(got) != tc.want || strings.Join(dropped, ",") != tc.dropped {
			t.Errorf("RedactJSON(%s, %q) = %s %q, want %s %q", tc.body, tc.pointers, got, dropped, tc.want, tc.dropped)
		}
	}
}

// CONTRACT.md "key-lifetime" (1.4): the claim's headers carry the key's expiry; 422 and 409 answer it through the
// error-shape hook's headers, a replay through its stored headers, and "claimed" hands it to the first answer.
func TestKeyLifetimeHeaders(t *testing.T) {
	const date = "Tue, 08 Dec 2026 10:30:00 GMT"
	dated := str(`{"Idempotency-Key-Expires": "` + date + `"}`)
	var i422, i409, i201 int32 = 422, 409, 201

	_, p, err := ClaimAnswer(ClaimRow{Outcome: OutcomeMismatch, HTTPStatus: &i422, ResponseHeaders: dated})
	if err != nil || p == nil || p.Header.Get(KeyExpiresHeader) != date {
		t.Fatalf("mismatch: %v %+v", err, p)
	}
	resp, _ := ClaimResponse("", ClaimRow{Outcome: OutcomeMismatch, HTTPStatus: &i422, ResponseHeaders: dated})
	if resp.Header.Get(KeyExpiresHeader) != date {
		t.Fatalf("mismatch's default problem+json: %v", resp.Header)
	}
	_, p, _ = ClaimAnswer(ClaimRow{Outcome: OutcomeInProgress, HTTPStatus: &i409, ResponseHeaders: dated})
	if p.Header.Get(KeyExpiresHeader) != date || p.Header.Get("Retry-After") != "1" {
		t.Fatalf("in_progress: %v", p.Header)
	}
	// a hook sees it among the headers the middleware adds
	var seen http.Header
	RenderProblem(func(w http.ResponseWriter, r *http.Request, p ProblemDetails) {
		seen = p.Header
		w.WriteHeader(p.Status)
	}, "", nil, *p)
	if seen.Get(KeyExpiresHeader) != date {
		t.Fatalf("hook: %v", seen)
	}
	// in progress without a known expiry (a transaction's claim in flight): Retry-After alone
	_, p, _ = ClaimAnswer(ClaimRow{Outcome: OutcomeInProgress, HTTPStatus: &i409})
	if len(p.Header) != 1 || p.Header.Get("Retry-After") != "1" {
		t.Fatalf("in_progress without expiry: %v", p.Header)
	}
	// replay: the stored headers as the server sends them, the member included
	resp, _, _ = ClaimAnswer(ClaimRow{Outcome: OutcomeReplay, HTTPStatus: &i201, ResponseBody: str("{}"),
		ResponseHeaders: str(`{"Location": "/p/1", "Idempotency-Key-Expires": "` + date + `"}`)})
	if resp.Header.Get(KeyExpiresHeader) != date || resp.Header.Get("Location") != "/p/1" {
		t.Fatalf("replay: %v", resp.Header)
	}
	// claimed: the headers for the first answer; a value that could split the header block is dropped
	c := ClaimRow{Outcome: OutcomeClaimed, ResponseHeaders: str(`{"Idempotency-Key-Expires": "` + date + `", "X-Bad": "a\r\nb", "X-Num": 1}`)}
	h := c.AnswerHeaders()
	if len(h) != 1 || h.Get(KeyExpiresHeader) != date {
		t.Fatalf("claimed: %v", h)
	}
	first := http.Header{"Location": {"/p/1"}}
	AddHeaders(first, h)
	if first.Get(KeyExpiresHeader) != date || first.Get("Location") != "/p/1" {
		t.Fatalf("first answer: %v", first)
	}
	// a 1.3 server: no headers on claimed
	if len((ClaimRow{Outcome: OutcomeClaimed}).AnswerHeaders()) != 0 {
		t.Fatal("1.3 claimed")
	}
}
