package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgx/v4"
)

// stripe renders the middleware's answers in Stripe's shape (CONTRACT.md "error-shape"): {"error": {"type":
// "idempotency_error", "message": <detail>}} as application/json, Stripe-Should-Retry true on 409 only.
func stripe(w http.ResponseWriter, r *http.Request, p idempotency.ProblemDetails) {
	for k, vs := range p.Header {
		w.Header()[k] = vs
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Stripe-Should-Retry", fmt.Sprint(p.Status == http.StatusConflict))
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"type": "idempotency_error", "message": p.Detail}})
}

func stripeMessage(t *testing.T, r testdb.Result, status int, retry string) string {
	t.Helper()
	var b struct {
		Error struct{ Type, Message string }
	}
	if r.Status != status || r.Header.Get("Content-Type") != "application/json" || r.Header.Get("Stripe-Should-Retry") != retry ||
		json.Unmarshal([]byte(r.Body), &b) != nil || b.Error.Type != "idempotency_error" || b.Error.Message == "" {
		t.Fatalf("want %d in Stripe's shape (Stripe-Should-Retry: %s): %+v", status, retry, r)
	}
	return b.Error.Message
}

// Options.RenderProblem writes every answer of the middleware's own in the API's shape: a missing, invalid or
// several keys (400), a key in flight (409, with Retry-After kept), a reused key (422), a body over the limit
// (413), a database failure (500); the handler's own answers are untouched. Fails before 1.4 (no hook: every
// one of them is problem+json).
func TestRenderProblemStripeShape(t *testing.T) {
	f := newFixture(t, idempotency.Options{RenderProblem: stripe, MaxBodyBytes: 64})
	stripeMessage(t, f.post(nil, `{}`), 400, "false")
	stripeMessage(t, f.post(ptr(`"bad`), `{}`), 400, "false")
	stripeMessage(t, f.post(ptr(`a, b`), `{}`), 400, "false")
	stripeMessage(t, f.post(ptr("k"), strings.Repeat(" ", 65)+"{}"), 413, "false")
	key := testdb.Unique("k")
	if r := f.post(ptr(key), `{"a": 1}`); r.Status != 201 || r.Header.Get("Stripe-Should-Retry") != "" {
		t.Fatalf("the handler's answer: %+v", r)
	}
	stripeMessage(t, f.post(ptr(key), `{"a": 2}`), 422, "false")

	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	held := testdb.Unique("k")
	if _, err := tx.Exec(ctx, `SELECT idem_claim($1::text, idem_hash('x'::text), NULL, $2::text)`, held, f.scope); err != nil {
		t.Fatal(err)
	}
	r := f.post(ptr(held), `{}`)
	stripeMessage(t, r, 409, "true")
	if r.Header.Get("Retry-After") != "1" {
		t.Fatalf("409 without Retry-After: %+v", r)
	}
	_ = tx.Rollback(ctx)

	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		_, err := tx.Exec(r.Context(), `SELECT 1/0`)
		return err
	}
	stripeMessage(t, f.post(ptr(testdb.Unique("k")), `{}`), 500, "false")
}

// Outcome expired (1.4, idempotency.tombstone_ttl) is 410 problem idempotency-key-expired, through the hook as
// every other answer of the middleware's. Fails before 1.4 (an unknown outcome: an error, answered 500).
func TestExpiredIs410(t *testing.T) {
	status := int32(410)
	c := idempotency.ClaimRow{Outcome: idempotency.OutcomeExpired, HTTPStatus: &status}
	resp, p, err := idempotency.ClaimAnswer(c)
	if err != nil || resp != nil || p == nil || p.Status != 410 || p.Type != "idempotency-key-expired" {
		t.Fatalf("ClaimAnswer(expired) = %+v, %+v, %v", resp, p, err)
	}
	def, err := idempotency.ClaimResponse("", c)
	if err != nil || def.Status != 410 || def.Header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(string(def.Body), `"type":"https://idempotency.dev/problems/idempotency-key-expired"`) {
		t.Fatalf("ClaimResponse(expired) = %+v, %v", def, err)
	}
	r := idempotency.RenderProblem(stripe, "", nil, *p)
	if r.Status != 410 || r.Header.Get("Stripe-Should-Retry") != "false" || !strings.Contains(string(r.Body), "idempotency_error") {
		t.Fatalf("rendered in Stripe's shape: %+v", r)
	}
}

// storedRow is the key's stored response as the table holds it.
func storedRow(t *testing.T, f *fixture, key string) (body *string, contentType *string, headers map[string]string) {
	t.Helper()
	if err := f.pool.QueryRow(context.Background(), `SELECT convert_from(response_bytes, 'UTF8'), response_content_type,
  response_headers FROM idempotency_keys WHERE key = $1 AND scope = $2`, key, f.scope).Scan(&body, &contentType, &headers); err != nil {
		t.Fatal(err)
	}
	return body, contentType, headers
}

// CONTRACT.md "store-less": Options.Redact drops the members it names from the stored body (never in the row),
// the first answer is sent whole, the stored headers and the replay say which were dropped; Options.OmitBody
// stores no body and no content type, and the replay is the status and headers with an empty body. Fails before
// 1.4 (the options do not exist).
func TestStoreLess(t *testing.T) {
	answer := func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"id": 7, "api_key": "sk_live_1", "card": {"number": "4242424242424242", "brand": "visa"}, "a~/b": 1}`))
		return err
	}
	f := newFixture(t, idempotency.Options{Redact: []string{"/card/number", "/nope", "/api_key", "/a~0~1b"}})
	f.behave = answer
	key := testdb.Unique("k")
	first := f.post(ptr(key), `{}`)
	if first.Status != 201 || !strings.Contains(first.Body, "sk_live_1") || !strings.Contains(first.Body, "4242") {
		t.Fatalf("the first answer is sent whole: %+v", first)
	}
	body, ct, headers := storedRow(t, f, key)
	want := `{"id": 7, "card": {"brand": "visa"}}`
	if body == nil || *body != want || ct == nil || *ct != "application/json" ||
		headers["Idempotent-Replay-Redacted"] != "/card/number, /api_key, /a~0~1b" {
		t.Fatalf("stored %v %v %v, want %s", body, ct, headers, want)
	}
	replay := f.post(ptr(key), `{}`)
	if !replay.Replayed() || replay.Body != want || replay.Header.Get("Idempotent-Replay-Redacted") != "/card/number, /api_key, /a~0~1b" {
		t.Fatalf("replay: %+v", replay)
	}

	f = newFixture(t, idempotency.Options{OmitBody: true})
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("Location", "/things/7")
		return answer(w, r, tx)
	}
	key = testdb.Unique("k")
	if first := f.post(ptr(key), `{}`); first.Status != 201 || !strings.Contains(first.Body, "sk_live_1") {
		t.Fatalf("the first answer is sent whole: %+v", first)
	}
	var rawBody, jsonBody *string
	if err := f.pool.QueryRow(context.Background(), `SELECT response_bytes::text, response_body::text FROM idempotency_keys
WHERE key = $1 AND scope = $2`, key, f.scope).Scan(&rawBody, &jsonBody); err != nil || rawBody != nil || jsonBody != nil {
		t.Fatalf("a body was stored: %v %v %v", rawBody, jsonBody, err)
	}
	_, ct, headers = storedRow(t, f, key)
	if ct != nil || headers["Idempotent-Replay-Body"] != "omitted" || headers["Location"] != "/things/7" {
		t.Fatalf("stored content type %v, headers %v", ct, headers)
	}
	replay = f.post(ptr(key), `{}`)
	if !replay.Replayed() || replay.Status != 201 || replay.Body != "" || replay.Header.Get("Idempotent-Replay-Body") != "omitted" ||
		replay.Header.Get("Location") != "/things/7" {
		t.Fatalf("replay: %+v", replay)
	}
}
