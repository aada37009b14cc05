package idempotency

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// DefaultProblemBase prefixes the problem types this package answers with (RFC 9457 "type").
const DefaultProblemBase = "https://idempotency.dev/problems/"

// BodyEncodingHeader, among the headers of a response stored by a 1.0-1.2 client through a jsonb completion, says
// how its body, not JSON, was put in a JSON string ("text" or "base64"), so the replay can decode it; it is never
// sent to the client.
const BodyEncodingHeader = "Idempotency-Body-Encoding"

// ReplayedHeader is added to every replayed response.
const ReplayedHeader = "Idempotent-Replayed"

// notReplayed are headers never stored for a replay (canonical keys): they describe one connection or one response.
var notReplayed = map[string]bool{"Connection": true, "Keep-Alive": true, "Transfer-Encoding": true,
	"Content-Length": true, "Date": true, "Server": true, "Set-Cookie": true, "Upgrade": true, "Te": true,
	"Trailer": true, "Proxy-Authenticate": true, "Proxy-Connection": true, ReplayedHeader: true, BodyEncodingHeader: true}

// Response is a complete, buffered HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Write sends r to w with a Content-Length that matches the body.
func (r *Response) Write(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range r.Header {
		h[k] = append([]string(nil), vs...)
	}
	h.Set("Content-Length", strconv.Itoa(len(r.Body)))
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// Problem is an RFC 9457 application/problem+json response. base prefixes slug to form the type
// (DefaultProblemBase when empty).
func Problem(base string, status int, slug, title, detail string) *Response {
	if base == "" {
		base = DefaultProblemBase
	}
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{base + slug, title, status, detail})
	return &Response{Status: status, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: body}
}

// ProblemDetails is an answer the middleware writes itself (CONTRACT.md "error-shape"): a key missing, invalid or
// several (400), a request in progress (409), an expired key (410), a body too large (413) or unreadable (400), a
// key reused (422), an internal error (500). Type is the problem type's last segment (idempotency-key-missing,
// idempotency-key-invalid, idempotency-key-in-progress, idempotency-key-expired, request-too-large,
// idempotency-key-reused, internal-error, ...); Header holds the headers the middleware adds (Retry-After: 1 on
// 409, Connection: close on a refused body), which a renderer should send.
type ProblemDetails struct {
	Status int
	Type   string
	Title  string
	Detail string
	Header http.Header
}

// RenderProblemFunc writes a ProblemDetails as the API wants it (status, headers, body): Options.RenderProblem,
// lease.Runner.RenderProblem. r is the request answered (nil where none is known).
type RenderProblemFunc func(w http.ResponseWriter, r *http.Request, p ProblemDetails)

// Response is p as application/problem+json (RFC 9457), its type base + p.Type (DefaultProblemBase when base is
// empty), with p.Header: the default rendering.
func (p ProblemDetails) Response(base string) *Response {
	resp := Problem(base, p.Status, p.Type, p.Title, p.Detail)
	for k, vs := range p.Header {
		resp.Header[k] = append([]string(nil), vs...)
	}
	return resp
}

// RenderProblem is the answer to p: render's, recorded, or the default problem+json (base as in
// ProblemDetails.Response) when render is nil.
func RenderProblem(render RenderProblemFunc, base string, r *http.Request, p ProblemDetails) *Response {
	if render == nil {
		return p.Response(base)
	}
	rec := NewRecorder()
	if p.Header == nil {
		p.Header = http.Header{}
	}
	render(rec, r, p)
	return rec.Response()
}

// Claim outcomes of idem_claim.
const (
	OutcomeClaimed    = "claimed"
	OutcomeReplay     = "replay"
	OutcomeMismatch   = "mismatch"
	OutcomeInProgress = "in_progress"
	// OutcomeExpired (1.4, idempotency.tombstone_ttl): the key's stored response expired; answered 410.
	OutcomeExpired = "expired"
)

// ClaimRow is one row of idem_claim, with the jsonb columns as their text (nil for SQL NULL); on 1.3, ResponseBody
// is the stored bytes and ContentType their content type when the response was stored as bytes.
type ClaimRow struct {
	Outcome         string
	HTTPStatus      *int32
	ResponseBody    *string
	ResponseHeaders *string
	ContentType     *string
}

// ClaimResponse maps a claim to the HTTP answer: nil for "claimed" (run the handler), the stored response (with
// ContentType when there is one) plus Idempotent-Replayed for "replay", 422 (or the status the extension gives) for "mismatch", 409 with
// Retry-After: 1 for "in_progress", 410 for "expired"; the problems as problem+json (ClaimAnswer gives them as
// ProblemDetails, for a RenderProblemFunc).
func ClaimResponse(base string, c ClaimRow) (*Response, error) {
	resp, p, err := ClaimAnswer(c)
	if p != nil {
		return p.Response(base), nil
	}
	return resp, err
}

// ClaimAnswer maps a claim to the HTTP answer: nothing for "claimed", the stored response for "replay", the
// problem of "mismatch", "in_progress" or "expired".
func ClaimAnswer(c ClaimRow) (*Response, *ProblemDetails, error) {
	switch c.Outcome {
	case OutcomeClaimed:
		return nil, nil, nil
	case OutcomeReplay:
		if c.HTTPStatus == nil {
			return nil, nil, fmt.Errorf("idempotency: replay without a stored status")
		}
		r, err := replayResponse(int(*c.HTTPStatus), c.ResponseBody, c.ResponseHeaders)
		if err == nil && c.ContentType != nil {
			r.Header.Set("Content-Type", *c.ContentType)
		}
		return r, nil, err
	case OutcomeMismatch:
		status := http.StatusUnprocessableEntity
		if c.HTTPStatus != nil {
			status = int(*c.HTTPStatus)
		}
		return nil, &ProblemDetails{Status: status, Type: "idempotency-key-reused", Title: "Idempotency-Key reused",
			Detail: "this Idempotency-Key was already used with a different request", Header: c.AnswerHeaders()}, nil
	case OutcomeInProgress:
		h := c.AnswerHeaders()
		h.Set("Retry-After", "1")
		return nil, &ProblemDetails{Status: http.StatusConflict, Type: "idempotency-key-in-progress",
			Title: "Request in progress", Detail: "a request with this Idempotency-Key is still being processed; retry later",
			Header: h}, nil
	case OutcomeExpired:
		return nil, &ProblemDetails{Status: http.StatusGone, Type: "idempotency-key-expired",
			Title:  "Idempotency-Key expired",
			Detail: "the response stored for this Idempotency-Key has expired; send the request with a new key",
			Header: http.Header{}}, nil
	}
	return nil, nil, fmt.Errorf("idempotency: unknown idem_claim outcome %q", c.Outcome)
}

// KeyExpiresHeader is the header that says until when the key is kept (CONTRACT.md "key-lifetime", 1.4): an
// HTTP-date the server writes into the claim's headers.
const KeyExpiresHeader = "Idempotency-Key-Expires"

// AnswerHeaders is the headers the claim's answer carries besides a replay's stored ones (1.4, CONTRACT.md
// "key-lifetime"): on "claimed", "mismatch" and "in_progress", the server's headers object (the key's expiry),
// never empty strings or other types; empty on a 1.0-1.3 server or when the server knows none. The first
// answer of a claimed key gets them before it is sent, and they are never passed to the completion.
func (c ClaimRow) AnswerHeaders() http.Header {
	h := http.Header{}
	if c.ResponseHeaders == nil || c.Outcome == OutcomeReplay {
		return h
	}
	var m map[string]any
	if json.Unmarshal([]byte(*c.ResponseHeaders), &m) != nil {
		return h
	}
	for k, v := range m {
		if s, ok := v.(string); ok && validHeaderValue(s) {
			h.Set(k, s)
		}
	}
	return h
}

// validHeaderValue: no CR, LF or NUL (a value that could split the header block).
func validHeaderValue(s string) bool {
	return !strings.ContainsAny(s, "\r\n\x00")
}

func replayResponse(status int, bodyText, headersText *string) (*Response, error) {
	stored := map[string]any{}
	if headersText != nil {
		if err := json.Unmarshal([]byte(*headersText), &stored); err != nil {
			return nil, fmt.Errorf("idempotency: stored headers: %w", err)
		}
	}
	h := http.Header{}
	encoding := ""
	for k, v := range stored {
		s, ok := v.(string)
		if !ok { // a value stored as another JSON type: its JSON text
			b, _ := json.Marshal(v)
			s = string(b)
		}
		if http.CanonicalHeaderKey(k) == BodyEncodingHeader {
			encoding = s
			continue
		}
		h.Set(k, s)
	}
	var body []byte
	if bodyText != nil {
		switch encoding {
		case "":
			body = []byte(*bodyText) // jsonb's canonical text of the stored JSON body
		case "text", "base64":
			var s string
			if err := json.Unmarshal([]byte(*bodyText), &s); err != nil {
				return nil, fmt.Errorf("idempotency: stored %s body: %w", encoding, err)
			}
			if encoding == "text" {
				body = []byte(s)
			} else {
				b, err := base64.StdEncoding.DecodeString(s)
				if err != nil {
					return nil, fmt.Errorf("idempotency: stored base64 body: %w", err)
				}
				body = b
			}
		default:
			return nil, fmt.Errorf("idempotency: unknown stored body encoding %q", encoding)
		}
	}
	h.Set(ReplayedHeader, "true")
	return &Response{Status: status, Header: h, Body: body}, nil
}

// StoredHeaders are the Content-Type (nil when none is stored) and the other headers, as a JSON object, that
// idem_complete_request and idem_lease_complete_request store for a replay: allow, when not nil, is the allow-list
// (case-insensitive); otherwise every header but the per-connection ones. Repeated headers are joined with ", ".
func StoredHeaders(h http.Header, allow []string) (contentType any, headers string) {
	contentType, out := storedHeaderMap(h, allow)
	b, _ := json.Marshal(out)
	return contentType, string(b)
}

func storedHeaderMap(h http.Header, allow []string) (contentType any, out map[string]string) {
	var allowed map[string]bool
	if allow != nil {
		allowed = map[string]bool{}
		for _, a := range allow {
			allowed[http.CanonicalHeaderKey(a)] = true
		}
	}
	out = map[string]string{}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		ck := http.CanonicalHeaderKey(k)
		if notReplayed[ck] || (allowed != nil && !allowed[ck]) || len(h[k]) == 0 {
			continue
		}
		v := strings.Join(h[k], ", ")
		if prev, ok := out[ck]; ok {
			v = prev + ", " + v
		}
		out[ck] = v
	}
	if ct, ok := out["Content-Type"]; ok {
		contentType = ct
		delete(out, "Content-Type")
	}
	return contentType, out
}

// Headers a stored response gains when a route stores less (CONTRACT.md "store-less").
const (
	// RedactedHeader lists the JSON Pointers dropped from the stored body, in the order given.
	RedactedHeader = "Idempotent-Replay-Redacted"
	// BodyOmittedHeader ("omitted") says the body was not stored: a replay answers an empty body.
	BodyOmittedHeader = "Idempotent-Replay-Body"
)

// StoreLess says what a route leaves out of the stored response (CONTRACT.md "store-less"): Options.Redact and
// Options.OmitBody, lease.Runner's.
type StoreLess struct {
	// Redact are JSON Pointers (RFC 6901: /card/number, /api_key) of members dropped from a JSON object response
	// body before it is stored; the answer sent keeps them.
	Redact []string
	// OmitBody stores only the status and the headers (body NULL, no content type).
	OmitBody bool
}

// Stored is what is stored of resp: its content type (nil for none), its headers as a JSON object (allow as in
// StoredHeaders) and its body (nil for NULL), with sl's members dropped or its body omitted, and the headers that
// say so.
func (sl StoreLess) Stored(resp *Response, allow []string) (contentType any, headers string, body []byte) {
	contentType, h := storedHeaderMap(resp.Header, allow)
	body = resp.Body
	switch {
	case sl.OmitBody:
		contentType, body = nil, nil
		h[BodyOmittedHeader] = "omitted"
	case len(sl.Redact) > 0:
		var dropped []string
		if body, dropped = RedactJSON(resp.Body, sl.Redact); len(dropped) > 0 {
			h[RedactedHeader] = strings.Join(dropped, ", ")
		}
	}
	b, _ := json.Marshal(h)
	return contentType, string(b), body
}

// RedactJSON drops the members named by pointers (RFC 6901 JSON Pointers) from a JSON object and returns the
// object without them and the pointers of the members actually dropped, in the order given. Members the pointers
// do not name keep their bytes, in their order (the object's own white space between members is not kept); a
// pointer may pass through arrays by index. A body that is not a JSON object comes back as it is, nothing dropped.
func RedactJSON(body []byte, pointers []string) ([]byte, []string) {
	if _, ok := parseObject(body); !ok {
		return body, nil
	}
	var dropped []string
	for _, ptr := range pointers {
		path, ok := parsePointer(ptr)
		if !ok || len(path) == 0 {
			continue
		}
		if out, ok := dropMember(body, path); ok {
			body = out
			dropped = append(dropped, ptr)
		}
	}
	return body, dropped
}

// parsePointer splits a JSON Pointer into its reference tokens (~1 is /, ~0 is ~).
func parsePointer(p string) ([]string, bool) {
	if p == "" || p[0] != '/' {
		return nil, false
	}
	parts := strings.Split(p[1:], "/")
	for i, t := range parts {
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return parts, true
}

type member struct {
	key   string
	value json.RawMessage
}

// parseObject reads a JSON object's members in their order, each value as its bytes.
func parseObject(b []byte) ([]member, bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var out []member
	for dec.More() {
		t, err := dec.Token()
		k, ok := t.(string)
		if err != nil || !ok {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		out = append(out, member{k, v})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return out, true
}

// dropMember removes the member at path from the JSON value b, reporting whether it was there.
func dropMember(b []byte, path []string) ([]byte, bool) {
	if members, ok := parseObject(b); ok {
		for i, m := range members {
			if m.key != path[0] {
				continue
			}
			if len(path) == 1 {
				return writeObject(append(members[:i:i], members[i+1:]...)), true
			}
			v, ok := dropMember(m.value, path[1:])
			if !ok {
				return b, false
			}
			members[i].value = v
			return writeObject(members), true
		}
		return b, false
	}
	var items []json.RawMessage
	if len(path) == 1 || json.Unmarshal(b, &items) != nil {
		return b, false // only members are dropped; an array is passed through by index
	}
	i, err := strconv.Atoi(path[0])
	if err != nil || i < 0 || i >= len(items) || strconv.Itoa(i) != path[0] {
		return b, false
	}
	v, ok := dropMember(items[i], path[1:])
	if !ok {
		return b, false
	}
	items[i] = v
	out, _ := json.Marshal(items)
	return out, true
}

func writeObject(members []member) []byte {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range members {
		if i > 0 {
			buf.WriteString(", ")
		}
		k, _ := json.Marshal(m.key)
		buf.Write(k)
		buf.WriteString(": ")
		buf.Write(bytes.TrimSpace(m.value))
	}
	buf.WriteByte('}')
	return buf.Bytes()
}

// The claim's value, idem_request_claim, is read in binary over prepared statements (decodeClaim: the composite's
// binary form, which no session setting changes) and as record_out's text under the simple protocol a pooler gets
// (decodeClaimText, which reads bytea in either bytea_output form); either way the client answers with
// ClaimResponse.

// The types of idem_request_claim's fields (outcome, http_status, content_type, headers, body), by their OIDs.
const (
	oidText  = 25
	oidInt4  = 23
	oidJSONB = 3802
	oidBytea = 17
)

var claimFieldTypes = [5]uint32{oidText, oidInt4, oidText, oidJSONB, oidBytea}

// decodeClaim reads idem_request_claim in the binary format of a composite (CONTRACT.md, "The claim"): an int32
// count of fields, then per field its type OID (uint32), its length (int32, -1 for NULL) and its binary value.
func decodeClaim(b []byte) (ClaimRow, error) {
	var c ClaimRow
	bad := func(what string) (ClaimRow, error) {
		return ClaimRow{}, fmt.Errorf("idempotency: idem_claim_request answered %d bytes the client cannot read: %s", len(b), what)
	}
	if len(b) < 4 || binary.BigEndian.Uint32(b) != uint32(len(claimFieldTypes)) {
		return bad("not a composite of 5 fields")
	}
	rest := b[4:]
	var fields [5][]byte
	for i := range fields {
		if len(rest) < 8 {
			return bad("cut short")
		}
		oid, n := binary.BigEndian.Uint32(rest), int32(binary.BigEndian.Uint32(rest[4:]))
		rest = rest[8:]
		if oid != claimFieldTypes[i] {
			return bad(fmt.Sprintf("field %d of type %d", i+1, oid))
		}
		if n < 0 {
			continue // NULL
		}
		if int64(n) > int64(len(rest)) {
			return bad("cut short")
		}
		fields[i], rest = rest[:n:n], rest[n:]
	}
	if len(rest) != 0 || fields[0] == nil {
		return bad("trailing bytes or no outcome")
	}
	c.Outcome = string(fields[0])
	if f := fields[1]; f != nil {
		if len(f) != 4 {
			return bad("a status of " + strconv.Itoa(len(f)) + " bytes")
		}
		status := int32(binary.BigEndian.Uint32(f))
		c.HTTPStatus = &status
	}
	if f := fields[2]; f != nil {
		s := string(f)
		c.ContentType = &s
	}
	if f := fields[3]; f != nil {
		if len(f) == 0 || f[0] != 1 {
			return bad("jsonb headers of an unknown version")
		}
		s := string(f[1:])
		c.ResponseHeaders = &s
	}
	if f := fields[4]; f != nil {
		s := string(f)
		c.ResponseBody = &s
	}
	return c, nil
}

// decodeClaimText reads idem_request_claim in its text form, the record literal (outcome,status,content
// type,headers,body) of record_out: of its fields only the body's text depends on a setting, bytea_output, and
// both of its forms are read (byteaText).
func decodeClaimText(value string) (ClaimRow, error) {
	f, err := parseRecord(value)
	if err != nil || len(f) != 5 || f[0] == nil {
		return ClaimRow{}, fmt.Errorf("idempotency: idem_claim_request answered %q", value)
	}
	c := ClaimRow{Outcome: *f[0], ContentType: f[2], ResponseHeaders: f[3]}
	if f[1] != nil {
		n, err := strconv.ParseInt(*f[1], 10, 32)
		if err != nil {
			return ClaimRow{}, fmt.Errorf("idempotency: idem_claim_request's status %q", *f[1])
		}
		status := int32(n)
		c.HTTPStatus = &status
	}
	if f[4] != nil {
		b, err := byteaText(*f[4])
		if err != nil {
			return ClaimRow{}, fmt.Errorf("idempotency: idem_claim_request's body: %w", err)
		}
		body := string(b)
		c.ResponseBody = &body
	}
	return c, nil
}

// byteaText decodes bytea's text output in either form of bytea_output: hex (\x then two hex digits a byte) or
// escape (a backslash doubled, an unprintable byte as a backslash and three octal digits, any other byte as it
// is). Escape output doubles every backslash, so it never starts with \x: the two forms cannot be confused.
func byteaText(s string) ([]byte, error) {
	if strings.HasPrefix(s, `\x`) {
		return hex.DecodeString(s[2:])
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] != '\\':
			b = append(b, s[i])
		case i+1 < len(s) && s[i+1] == '\\':
			b = append(b, '\\')
			i++
		case i+3 < len(s) && s[i+1] >= '0' && s[i+1] <= '3' && isOctal(s[i+2]) && isOctal(s[i+3]):
			b = append(b, (s[i+1]-'0')<<6|(s[i+2]-'0')<<3|(s[i+3]-'0'))
			i += 3
		default:
			return nil, fmt.Errorf("invalid bytea escape at byte %d", i)
		}
	}
	return b, nil
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// parseRecord splits the text form of a record, (a,,"b c","d""e"), into its fields: nil for NULL (an empty
// unquoted field); quotes group, a doubled quote inside them and a backslash escape the next character.
func parseRecord(s string) ([]*string, error) {
	if len(s) < 2 || s[0] != '(' || s[len(s)-1] != ')' {
		return nil, fmt.Errorf("not a record: %q", s)
	}
	s = s[1 : len(s)-1]
	var fields []*string
	var b strings.Builder
	present, quoted := false, false
	for i := 0; i <= len(s); i++ {
		switch {
		case i == len(s) || (!quoted && s[i] == ','):
			var f *string
			if present {
				v := b.String()
				f = &v
			}
			fields = append(fields, f)
			b.Reset()
			present = false
		case s[i] == '"' && quoted && i+1 < len(s) && s[i+1] == '"', s[i] == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case s[i] == '"':
			quoted, present = !quoted, true
		default:
			b.WriteByte(s[i])
			present = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote in %q", s)
	}
	return fields, nil
}

// validJSON is json.Valid plus what PostgreSQL's jsonb refuses and Go accepts: the \u0000 escape. (Invalid
// UTF-8, which jsonb refuses too, is checked by the callers.) In valid JSON a backslash occurs only inside a string,
// where it starts an escape, so the escapes are found by skipping each escaped character.
func validJSON(b []byte) bool {
	if !json.Valid(b) {
		return false
	}
	for i := bytes.IndexByte(b, '\\'); i >= 0; i = bytes.IndexByte(b, '\\') {
		if bytes.HasPrefix(b[i+1:], []byte("u0000")) {
			return false
		}
		b = b[i+2:]
	}
	return true
}

// ValidRequestBody reports whether a request body is JSON PostgreSQL's jsonb accepts (UTF-8, no \u0000).
func ValidRequestBody(b []byte) bool {
	return utf8.Valid(b) && validJSON(b)
}
