package idempotency

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func i32(v int32) *int32   { return &v }
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

func TestClaimResponse(t *testing.T) {
	tests := []struct {
		name       string
		row        ClaimRow
		nilResp    bool
		status     int
		slug       string // problem type suffix; "" for a replay
		retryAfter string
		body       string
		headers    map[string]string
	}{
		{name: "claimed runs the handler", row: ClaimRow{Outcome: "claimed"}, nilResp: true},
		{name: "replay 201", row: ClaimRow{Outcome: "replay", HTTPStatus: i32(201),
			ResponseBody:    str(`{"payment_id": 7}`),
			ResponseHeaders: str(`{"Content-Type": "application/json", "Location": "/payments/7"}`)},
			status: 201, body: `{"payment_id": 7}`,
			headers: map[string]string{"Content-Type": "application/json", "Location": "/payments/7", "Idempotent-Replayed": "true"}},
		{name: "replay stored 4xx", row: ClaimRow{Outcome: "replay", HTTPStatus: i32(402),
			ResponseBody: str(`{"error": "insufficient funds"}`), ResponseHeaders: str(`{}`)},
			status: 402, body: `{"error": "insufficient funds"}`, headers: map[string]string{"Idempotent-Replayed": "true"}},
		{name: "replay without body or headers", row: ClaimRow{Outcome: "replay", HTTPStatus: i32(204)},
			status: 204, body: "", headers: map[string]string{"Idempotent-Replayed": "true"}},
		{name: "replay text body", row: ClaimRow{Outcome: "replay", HTTPStatus: i32(200),
			ResponseBody: str(`"hello\nworld"`), ResponseHeaders: str(`{"Content-Type": "text/plain", "Idempotency-Body-Encoding": "text"}`)},
			status: 200, body: "hello\nworld", headers: map[string]string{"Content-Type": "text/plain", "Idempotency-Body-Encoding": ""}},
		{name: "replay base64 body", row: ClaimRow{Outcome: "replay", HTTPStatus: i32(200),
			ResponseBody: str(`"AP8="`), ResponseHeaders: str(`{"Idempotency-Body-Encoding": "base64"}`)},
			status: 200, body: "\x00\xff"},
		{name: "mismatch 422", row: ClaimRow{Outcome: "mismatch", HTTPStatus: i32(422)}, status: 422, slug: "idempotency-key-reused"},
		{name: "mismatch configured 400", row: ClaimRow{Outcome: "mismatch", HTTPStatus: i32(400)}, status: 400, slug: "idempotency-key-reused"},
		{name: "mismatch without status", row: ClaimRow{Outcome: "mismatch"}, status: 422, slug: "idempotency-key-reused"},
		{name: "in progress", row: ClaimRow{Outcome: "in_progress", HTTPStatus: i32(409)}, status: 409,
			slug: "idempotency-key-in-progress", retryAfter: "1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ClaimResponse("", tc.row)
			if err != nil {
				t.Fatal(err)
			}
			if tc.nilResp {
				if r != nil {
					t.Fatalf("want nil, got %+v", r)
				}
				return
			}
			if r.Status != tc.status {
				t.Fatalf("status %d, want %d", r.Status, tc.status)
			}
			if tc.slug != "" {
				p := decodeProblem(t, r)
				if p.Type != DefaultProblemBase+tc.slug {
					t.Fatalf("type %q, want %q", p.Type, DefaultProblemBase+tc.slug)
				}
				if r.Header.Get("Idempotent-Replayed") != "" {
					t.Fatal("a problem is not a replay")
				}
			} else if string(r.Body) != tc.body {
				t.Fatalf("body %q, want %q", r.Body, tc.body)
			}
			if got := r.Header.Get("Retry-After"); got != tc.retryAfter {
				t.Fatalf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			for k, v := range tc.headers {
				if got := r.Header.Get(k); got != v {
					t.Fatalf("header %s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestClaimResponseErrors(t *testing.T) {
	for _, row := range []ClaimRow{
		{Outcome: "bogus"},
		{Outcome: "replay"}, // no status
		{Outcome: "replay", HTTPStatus: i32(200), ResponseHeaders: str(`[1]`)},
		{Outcome: "replay", HTTPStatus: i32(200), ResponseBody: str(`1`), ResponseHeaders: str(`{"Idempotency-Body-Encoding": "rot13"}`)},
	} {
		if r, err := ClaimResponse("", row); err == nil {
			t.Errorf("ClaimResponse(%+v) = %+v, want an error", row, r)
		}
	}
}

// StoredForm followed by the replay gives back the same response.
func TestStoredFormRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		resp     Response
		allow    []string
		encoding string
		dropped  []string
	}{
		{name: "json", resp: Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/1"}},
			Body: []byte(`{"payment_id":1}`)}},
		{name: "problem json", resp: Response{Status: 422, Header: http.Header{"Content-Type": {"application/problem+json"}},
			Body: []byte(`{"type":"x"}`)}},
		{name: "text", resp: Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
			Body: []byte("plain text \u00e9")}, encoding: "text"},
		{name: "json type but not json", resp: Response{Status: 200, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte("{not json")}, encoding: "text"},
		{name: "binary", resp: Response{Status: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}},
			Body: []byte{0, 1, 0xff, 0xfe}}, encoding: "base64"},
		{name: "empty", resp: Response{Status: 204, Header: http.Header{}}},
		{name: "per-connection headers dropped", resp: Response{Status: 200,
			Header: http.Header{"Set-Cookie": {"a=b"}, "Date": {"x"}, "Content-Length": {"3"}, "X-Request": {"1"}}},
			dropped: []string{"Set-Cookie", "Date", "Content-Length"}},
		{name: "allow list", resp: Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"},
			"Location": {"/p/1"}, "X-Trace": {"t"}}, Body: []byte(`{}`)},
			allow: []string{"content-type", "LOCATION"}, dropped: []string{"X-Trace"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, headers := StoredForm(&tc.resp, tc.allow)
			var stored map[string]string
			if err := json.Unmarshal([]byte(headers), &stored); err != nil {
				t.Fatalf("headers %q: %v", headers, err)
			}
			if stored[BodyEncodingHeader] != tc.encoding {
				t.Fatalf("encoding %q, want %q", stored[BodyEncodingHeader], tc.encoding)
			}
			if body != nil && !json.Valid([]byte(*body)) {
				t.Fatalf("stored body %q is not JSON", *body)
			}
			if (body == nil) != (len(tc.resp.Body) == 0) {
				t.Fatalf("stored body %v for response body %q", body, tc.resp.Body)
			}
			status := int32(tc.resp.Status)
			r, err := ClaimResponse("", ClaimRow{Outcome: "replay", HTTPStatus: &status, ResponseBody: body, ResponseHeaders: &headers})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != tc.resp.Status || string(r.Body) != string(tc.resp.Body) {
				t.Fatalf("replayed %d %q, want %d %q", r.Status, r.Body, tc.resp.Status, tc.resp.Body)
			}
			for _, k := range tc.dropped {
				if r.Header.Get(k) != "" {
					t.Fatalf("header %s stored", k)
				}
			}
			for k := range tc.resp.Header {
				dropped := false
				for _, d := range tc.dropped {
					dropped = dropped || d == k
				}
				if !dropped && r.Header.Get(k) != tc.resp.Header.Get(k) {
					t.Fatalf("header %s = %q, want %q", k, r.Header.Get(k), tc.resp.Header.Get(k))
				}
			}
			if r.Header.Get(BodyEncodingHeader) != "" || r.Header.Get(ReplayedHeader) != "true" {
				t.Fatalf("replay headers %v", r.Header)
			}
		})
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

// idem_claim_request's value in its text form and in its binary form (built here from the fields the text form
// gives): the record's quoting, NULL fields, the bytea body, and a key stored through the jsonb completion of
// 1.0-1.2 (its body in a JSON string, the encoding in a stored header).
func TestClaimRequestResponse(t *testing.T) {
	for _, tc := range []struct {
		value, status, contentType, location, body string
	}{
		{`(claimed,,,,)`, "", "", "", ""},
		{`(replay,201,application/json,"{""Location"": ""/p/1""}","\\x7b2261223a317d")`, "201", "application/json", "/p/1", `{"a":1}`},
		{`(replay,204,,,)`, "204", "", "", ""},
		{`(replay,200,,"{""Content-Type"": ""text/plain"", ""Idempotency-Body-Encoding"": ""text""}","\\x2268692c205c22796f755c2222")`,
			"200", "text/plain", "", `hi, "you"`},
		{`(mismatch,422,,,)`, "422", "application/problem+json", "", ""},
		{`(in_progress,409,,,)`, "409", "application/problem+json", "", ""},
	} {
		f, err := textClaim(tc.value, nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.value, err)
		}
		if fb, err := binaryClaim(binaryRecord(f)); err != nil || !reflect.DeepEqual(fb, f) {
			t.Fatalf("%s: the binary form gives %v, %v", tc.value, fb, err)
		}
		r, err := claimResponse("", f)
		if err != nil || (r == nil) != (tc.status == "") {
			t.Fatalf("%s: %+v %v", tc.value, r, err)
		}
		if r != nil && (strconv.Itoa(r.Status) != tc.status || r.Header.Get("Content-Type") != tc.contentType ||
			r.Header.Get("Location") != tc.location || (tc.body != "" && string(r.Body) != tc.body) ||
			r.Header.Get(BodyEncodingHeader) != "") {
			t.Errorf("%s: %d %v %q", tc.value, r.Status, r.Header, r.Body)
		}
	}
	for _, bad := range []string{``, `(replay`, `(replay,200,,,"\\xZZ")`, `("a)`, `(a,b)`} {
		if _, err := textClaim(bad, nil); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := claimResponse("", []*string{str("replay"), str("x"), nil, nil, nil}); err == nil {
		t.Error("a status that is not a number: no error")
	}
	for _, bad := range [][]byte{nil, {0, 0, 0, 1}, {0, 0, 0, 1, 0, 0, 0, 25, 0, 0, 0, 9, 'x'},
		{0, 0, 0, 1, 0, 0, 0, 23, 0, 0, 0, 3, 1, 2, 3}, {0, 0, 0, 1, 0, 0, 0x0e, 0xda, 0, 0, 0, 2, 2, '{'}} {
		if _, err := binaryClaim(bad); err == nil {
			t.Errorf("binary %x: no error", bad)
		}
	}
}

// binaryRecord is the binary form of a record of idem_claim_request's fields (text, int4, text, jsonb, bytea).
func binaryRecord(f []*string) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(f)))
	for i, v := range f {
		b = binary.BigEndian.AppendUint32(b, []uint32{25, 23, 25, 3802, 17}[i])
		if v == nil {
			b = binary.BigEndian.AppendUint32(b, 0xffffffff)
			continue
		}
		field := []byte(*v)
		if n, err := strconv.Atoi(*v); i == 1 && err == nil {
			field = binary.BigEndian.AppendUint32(nil, uint32(n))
		} else if i == 3 {
			field = append([]byte{1}, field...)
		}
		b = append(binary.BigEndian.AppendUint32(b, uint32(len(field))), field...)
	}
	return b
}
