package idempotency

import (
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
func TestClaimResponse(t *testing.T) {
	for _, tc := range []struct {
		value, status, slug, contentType, location, body string
	}{
		{`(claimed,,,,)`, "", "", "", "", ""},
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","\\x7b2261223a317d")`, "201", "", "application/json", "/p/1", `{"a":1}`},
		{`(replay,204,,,)`, "204", "", "", "", ""},
		{`(replay,402,,"{}","\\x7b2265223a317d")`, "402", "", "", "", `{"e":1}`},
		{`(replay,200,,"{""Content-Type"": ""text/plain"", ""Idempotency-Body-Encoding"": ""text""}","\\x2268692c205c22796f755c2222")`,
			"200", "", "text/plain", "", `hi, "you"`},
		{`(replay,200,,"{""Idempotency-Body-Encoding"": ""base64""}","\\x224150383d22")`, "200", "", "", "", "\x00\xff"},
		{`(mismatch,422,,,)`, "422", "idempotency-key-reused", "application/problem+json", "", ""},
		{`(mismatch,400,,,)`, "400", "idempotency-key-reused", "application/problem+json", "", ""},
		{`(mismatch,,,,)`, "422", "idempotency-key-reused", "application/problem+json", "", ""},
		{`(in_progress,409,,,)`, "409", "idempotency-key-in-progress", "application/problem+json", "", ""},
	} {
		t.Run(tc.value, func(t *testing.T) {
			r, err := claimResponse("", tc.value)
			if err != nil || (r == nil) != (tc.status == "") {
				t.Fatalf("%s: %+v %v", tc.value, r, err)
			} else if r == nil {
				return
			}
			if strconv.Itoa(r.Status) != tc.status || r.Header.Get("Content-Type") != tc.contentType ||
				r.Header.Get("Location") != tc.location || (tc.slug == "" && string(r.Body) != tc.body) ||
				r.Header.Get(BodyEncodingHeader) != "" || r.Header.Get(ReplayedHeader) != map[bool]string{true: "true"}[tc.slug == ""] {
				t.Errorf("%s: %d %v %q", tc.value, r.Status, r.Header, r.Body)
			}
			if tc.slug != "" && decodeProblem(t, r).Type != DefaultProblemBase+tc.slug ||
				r.Header.Get("Retry-After") != map[bool]string{true: "1"}[tc.slug == "idempotency-key-in-progress"] {
				t.Errorf("%s: problem %s, Retry-After %q", tc.value, r.Body, r.Header.Get("Retry-After"))
			}
		})
	}
	// Not records, not five fields, an outcome or a status or stored headers or a body encoding no one knows, a
	// replay without a status, a body that is not hex.
	for _, bad := range []string{``, `(replay`, `("a)`, `(a,b)`, `(bogus,,,,)`, `(replay,x,,,)`, `(replay,,,,)`,
		`(replay,200,,"[1]",)`, `(replay,200,,"{""Idempotency-Body-Encoding"": ""rot13""}","\\x31")`, `(replay,200,,,"\\xZZ")`} {
		if _, err := claimResponse("", bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
