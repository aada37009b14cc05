package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"example.com/idempotency"
	"example.com/idempotency/internal/testdb"
	"github.com/jackc/pgx/v4/pgxpool"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		body     string
		amount   int64
		currency string
		ok       bool
	}{
		{`{"amount_cents": 10000, "currency": "USD"}`, 10000, "USD", true},
		{`{"currency": "EUR", "amount_cents": 1}`, 1, "EUR", true},
		{`{"amount_cents": 9223372036854775807, "currency": "JPY"}`, 9223372036854775807, "JPY", true},
		{`{"amount_cents": 0, "currency": "USD"}`, 0, "", false},
		{`{"amount_cents": -5, "currency": "USD"}`, 0, "", false},
		{`{"amount_cents": 1.5, "currency": "USD"}`, 0, "", false},
		{`{"amount_cents": 1e2, "currency": "USD"}`, 0, "", false},
		{`{"amount_cents": "100", "currency": "USD"}`, 0, "", false},
		{`{"amount_cents": 9223372036854775808, "currency": "USD"}`, 0, "", false},
		{`{"currency": "USD"}`, 0, "", false},
		{`{"amount_cents": 100, "currency": "usd"}`, 0, "", false},
		{`{"amount_cents": 100, "currency": "USDX"}`, 0, "", false},
		{`{"amount_cents": 100, "currency": 840}`, 0, "", false},
		{`{"amount_cents": 100}`, 0, "", false},
		{`[1]`, 0, "", false},
		{`"x"`, 0, "", false},
		{`null`, 0, "", false},
	} {
		amount, currency, detail := validate([]byte(tc.body))
		if (detail == "") != tc.ok || amount != tc.amount || currency != tc.currency {
			t.Errorf("validate(%s) = %d %q %q, want ok=%v %d %q", tc.body, amount, currency, detail, tc.ok, tc.amount, tc.currency)
		}
	}
}

// Requests that are answered before any database work need no database.
func TestAnswersWithoutDatabase(t *testing.T) {
	srv := httptest.NewServer(mustHandler(t, nil, Config{Logger: log.New(io.Discard, "", 0)}))
	defer srv.Close()
	c := client{t: t, url: srv.URL}
	if r := c.get("/healthz"); r.status != 200 || r.body != `{"ok":true}` || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("healthz: %+v", r)
	}
	for _, auth := range []string{"", "Bearer", "Bearer ", "Basic abc", "Bearer UPPER", "Bearer a-b",
		"Bearer " + strings.Repeat("a", 65), "Bearer a b"} {
		r := c.post("/payments", auth, ptr("k1"), `{"amount_cents": 1, "currency": "USD"}`, nil)
		if r.status != 401 || r.problemType() != "unauthorized" || r.header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("Authorization %q: %+v", auth, r)
		}
	}
	if r := c.post("/payments", "Bearer alice", nil, `{}`, nil); r.status != 400 || r.problemType() != "idempotency-key-missing" {
		t.Fatalf("no key: %+v", r)
	}
	if r := c.post("/payments", "Bearer alice", ptr(`"bad`), `{}`, nil); r.status != 400 || r.problemType() != "idempotency-key-invalid" {
		t.Fatalf("bad key: %+v", r)
	}
	if r := c.post("/payments", "Bearer alice", ptr("k1"), `amount=1`, nil); r.status != 400 || r.problemType() != "request-body-not-json" {
		t.Fatalf("not JSON: %+v", r)
	}
	if r := c.get("/payments"); r.status != 405 || r.header.Get("Allow") != "POST" {
		t.Fatalf("GET /payments: %+v", r)
	}
	if r := c.post("/healthz", "", nil, `{}`, nil); r.status != 405 || r.header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST /healthz: %+v", r)
	}
	if r := c.post("/payments", "Bearer alice", ptr("k1,k2"), `{}`, nil); r.status != 400 ||
		r.problemType() != "idempotency-key-invalid" || !strings.Contains(r.body, "several") {
		t.Fatalf("two keys: %+v", r)
	}
	big := `{"amount_cents": 1, "currency": "USD"}` + strings.Repeat(" ", MaxBodyBytes)
	for _, path := range []string{"/payments", "/payments-unprotected"} {
		if r := c.post(path, "Bearer alice", ptr("k1"), big, nil); r.status != 413 || r.problemType() != "request-too-large" {
			t.Fatalf("%s, a body over 1 MiB: %d %s", path, r.status, r.body)
		}
	}
	if r := c.get("/nope"); r.status != 404 {
		t.Fatalf("GET /nope: %+v", r)
	}
}

type client struct {
	t   *testing.T
	url string
}

type result struct {
	status int
	header http.Header
	body   string
}

func (r result) problemType() string {
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	_ = json.Unmarshal([]byte(r.body), &p)
	if p.Status != r.status || r.header.Get("Content-Type") != "application/problem+json" {
		return "(not a problem)"
	}
	return strings.TrimPrefix(p.Type, idempotency.DefaultProblemBase)
}

func (r result) payment(t *testing.T) payment {
	t.Helper()
	var p payment
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("payment body %q: %v", r.body, err)
	}
	return p
}

func ptr(s string) *string { return &s }

func (c client) get(path string) result {
	resp, err := http.Get(c.url + path)
	if err != nil {
		c.t.Fatal(err)
	}
	return read(c.t, resp)
}

func read(t *testing.T, resp *http.Response) result {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{resp.StatusCode, resp.Header, string(b)}
}

func (c client) post(path, auth string, key *string, body string, hdr map[string]string) result {
	req, _ := http.NewRequest(http.MethodPost, c.url+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if key != nil {
		req.Header.Set("Idempotency-Key", *key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	return read(c.t, resp)
}

func mustHandler(t *testing.T, db idempotency.DB, cfg Config) http.Handler {
	h, err := NewHandler(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func startService(t *testing.T) (*pgxpool.Pool, client) {
	return startFramework(t, "")
}

func startFramework(t *testing.T, framework string) (*pgxpool.Pool, client) {
	pool := testdb.Pool(t)
	srv := httptest.NewServer(mustHandler(t, pool, Config{Faults: true, Framework: framework, Logger: log.New(io.Discard, "", 0)}))
	t.Cleanup(srv.Close)
	return pool, client{t: t, url: srv.URL}
}

func TestUnknownFramework(t *testing.T) {
	if _, err := NewHandler(nil, Config{Framework: "martini"}); err == nil || !strings.Contains(err.Error(), "martini") {
		t.Fatalf("%v", err)
	}
}

// X-Fault throw-422 / throw-502: each framework's own HTTP error raised after the ledger insert. The 422 is sent,
// stored and replayed byte for byte with the debit kept; the 502 is sent and rolled back. Never a 200.
func TestThrownErrorsEveryFramework(t *testing.T) {
	for _, fw := range Frameworks {
		t.Run(fw, func(t *testing.T) {
			pool, c := startFramework(t, fw)
			body := `{"amount_cents": 300, "currency": "USD"}`
			account := testdb.Unique("acct_")
			key := testdb.Unique("pay-")
			auth := "Bearer " + account
			first := c.post("/payments", auth, ptr(key), body, map[string]string{"X-Fault": "throw-422"})
			second := c.post("/payments", auth, ptr(key), body, nil)
			if first.status != 422 || second.status != 422 || second.header.Get("Idempotent-Replayed") != "true" ||
				second.body != first.body {
				t.Fatalf("throw-422: first %+v, replay %+v", first, second)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 1 {
				t.Fatalf("throw-422: %d ledger rows, want the debit sent with the 422", n)
			}
			account = testdb.Unique("acct_")
			auth = "Bearer " + account
			if r := c.post("/payments", auth, ptr(key), body, map[string]string{"X-Fault": "throw-502"}); r.status != 502 {
				t.Fatalf("throw-502: %+v", r)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 0 {
				t.Fatalf("throw-502: %d ledger rows", n)
			}
			first = c.post("/payments", auth, ptr(key), body, nil)
			second = c.post("/payments", auth, ptr(key), body, nil)
			if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" || second.body != first.body ||
				second.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("after throw-502: first %+v, replay %+v", first, second)
			}
			// Validation is answered not executed in every framework: the corrected request runs.
			key = testdb.Unique("pay-")
			if r := c.post("/payments", auth, ptr(key), `{"amount_cents": 0, "currency": "USD"}`, nil); r.status != 422 || r.problemType() != "invalid-payment" {
				t.Fatalf("invalid: %+v", r)
			}
			if r := c.post("/payments", auth, ptr(key), body, nil); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("corrected: %+v", r)
			}
		})
	}
}

func TestPaymentStory(t *testing.T) {
	pool, c := startService(t)
	account := testdb.Unique("acct_")
	auth := "Bearer " + account
	key := testdb.Unique("pay-")
	body := `{"amount_cents": 10000, "currency": "USD"}`

	first := c.post("/payments", auth, ptr(key), body, nil)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %+v", first)
	}
	p := first.payment(t)
	if p.Account != account || p.AmountCents != 10000 || p.Currency != "USD" || p.PaymentID <= 0 ||
		first.header.Get("Location") != fmt.Sprintf("/payments/%d", p.PaymentID) {
		t.Fatalf("first: %+v %+v", first, p)
	}
	// The response was lost; the retry (quoted key, reordered body) replays.
	retry := c.post("/payments", auth, ptr(`"`+key+`"`), `{"currency":"USD","amount_cents":10000}`, nil)
	if retry.status != 201 || retry.header.Get("Idempotent-Replayed") != "true" || retry.payment(t) != p ||
		retry.header.Get("Location") != first.header.Get("Location") || retry.header.Get("Content-Type") != "application/json" {
		t.Fatalf("retry: %+v", retry)
	}
	// A tampered amount with the same key.
	if r := c.post("/payments", auth, ptr(key), `{"amount_cents": 100000, "currency": "USD"}`, nil); r.status != 422 || r.problemType() != "idempotency-key-reused" {
		t.Fatalf("tampered: %+v", r)
	}
	// The same key from another account is another key.
	other := testdb.Unique("acct_")
	if r := c.post("/payments", "Bearer "+other, ptr(key), body, nil); r.status != 201 || r.header.Get("Idempotent-Replayed") != "" || r.payment(t).Account != other {
		t.Fatalf("other account: %+v", r)
	}
	var n int
	var sum int64
	if err := pool.QueryRow(context.Background(), `SELECT count(*), sum(amount_cents) FROM ledger WHERE account = $1::text AND idempotency_key = $2::text`, account, key).Scan(&n, &sum); err != nil || n != 1 || sum != -10000 {
		t.Fatalf("ledger: %d rows, sum %d (%v); want one debit of -10000", n, sum, err)
	}
}

// A validation 422 is not executed: not stored, the key released, so the corrected request with the same key
// is a new payment (as Stripe does).
func TestValidationNotExecuted(t *testing.T) {
	pool, c := startService(t)
	account := testdb.Unique("acct_")
	key := testdb.Unique("pay-")
	r1 := c.post("/payments", "Bearer "+account, ptr(key), `{"amount_cents": -1, "currency": "USD"}`, nil)
	r2 := c.post("/payments", "Bearer "+account, ptr(key), `{"amount_cents": -1, "currency": "USD"}`, nil)
	if r1.status != 422 || r1.problemType() != "invalid-payment" || r2.status != 422 ||
		r2.header.Get("Idempotent-Replayed") != "" || r2.problemType() != "invalid-payment" {
		t.Fatalf("first %+v, second %+v", r1, r2)
	}
	r3 := c.post("/payments", "Bearer "+account, ptr(key), `{"amount_cents": 1, "currency": "USD"}`, nil)
	if r3.status != 201 || r3.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("corrected: %+v", r3)
	}
	if n := testdb.LedgerRows(t, pool, account); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
}

func TestFaultsNotCached(t *testing.T) {
	for _, fw := range Frameworks {
		t.Run(fw, func(t *testing.T) { faultsNotCached(t, fw) })
	}
}

func faultsNotCached(t *testing.T, framework string) {
	pool, c := startFramework(t, framework)
	for _, tc := range []struct {
		fault  string
		status int
		slug   string
	}{
		{"503", 503, "upstream-unavailable"},
		{"db-error", 500, "internal-error"},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			account := testdb.Unique("acct_")
			auth := "Bearer " + account
			key := testdb.Unique("pay-")
			body := `{"amount_cents": 500, "currency": "EUR"}`
			r := c.post("/payments", auth, ptr(key), body, map[string]string{"X-Fault": tc.fault})
			if r.status != tc.status || r.problemType() != tc.slug {
				t.Fatalf("fault: %+v", r)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 0 {
				t.Fatalf("the fault left %d ledger rows", n)
			}
			r = c.post("/payments", auth, ptr(key), body, nil)
			if r.status != 201 || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("retry: %+v", r)
			}
			r = c.post("/payments", auth, ptr(key), body, nil)
			if r.status != 201 || r.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second retry: %+v", r)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 1 {
				t.Fatalf("%d ledger rows, want 1", n)
			}
		})
	}
}

func TestFaultsNeedTheSwitch(t *testing.T) {
	pool := testdb.Pool(t)
	srv := httptest.NewServer(mustHandler(t, pool, Config{Faults: false, Logger: log.New(io.Discard, "", 0)}))
	defer srv.Close()
	c := client{t: t, url: srv.URL}
	r := c.post("/payments", "Bearer "+testdb.Unique("acct_"), ptr(testdb.Unique("pay-")), `{"amount_cents": 1, "currency": "USD"}`,
		map[string]string{"X-Fault": "503"})
	if r.status != 201 {
		t.Fatalf("X-Fault without PAYMENTS_FAULTS=1: %+v", r)
	}
}

// A double click: the second request arrives while the first sleeps inside its transaction.
func TestDoubleClickInProgress(t *testing.T) {
	pool, c := startService(t)
	account := testdb.Unique("acct_")
	auth := "Bearer " + account
	key := testdb.Unique("pay-")
	body := `{"amount_cents": 700, "currency": "GBP"}`
	var wg sync.WaitGroup
	var slow result
	wg.Add(1)
	go func() {
		defer wg.Done()
		slow = c.post("/payments", auth, ptr(key), body, map[string]string{"X-Fault": "sleep=4000"})
	}()
	time.Sleep(time.Second)
	start := time.Now()
	fast := c.post("/payments", auth, ptr(key), body, nil)
	// A click that waited for the holder (4 s) would take 3 s or more; 2 s leaves margin for loaded cores.
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("the second click waited %v", took)
	}
	wg.Wait()
	if fast.status != 409 || fast.header.Get("Retry-After") != "1" || fast.problemType() != "idempotency-key-in-progress" {
		t.Fatalf("second click: %+v", fast)
	}
	if slow.status != 201 || slow.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first click: %+v", slow)
	}
	if n := testdb.LedgerRows(t, pool, account); n != 1 {
		t.Fatalf("%d ledger rows", n)
	}
}

func TestUnprotected(t *testing.T) {
	pool, c := startService(t)
	account := testdb.Unique("acct_")
	auth := "Bearer " + account
	body := `{"amount_cents": 100, "currency": "USD"}`
	for i := 0; i < 2; i++ {
		r := c.post("/payments-unprotected", auth, nil, body, nil)
		if r.status != 201 || r.payment(t).AmountCents != 100 || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("unprotected: %+v", r)
		}
	}
	if r := c.post("/payments-unprotected", auth, nil, body, map[string]string{"X-Fault": "db-error"}); r.status != 500 {
		t.Fatalf("db-error: %+v", r)
	}
	if r := c.post("/payments-unprotected", auth, nil, body, map[string]string{"X-Fault": "503"}); r.status != 503 {
		t.Fatalf("503: %+v", r)
	}
	if r := c.post("/payments-unprotected", auth, nil, `nope`, nil); r.status != 400 {
		t.Fatalf("not JSON: %+v", r)
	}
	if r := c.post("/payments-unprotected", "", nil, body, nil); r.status != 401 {
		t.Fatalf("no auth: %+v", r)
	}
	// No claim: two debits for two identical requests, none for the failures.
	if n := testdb.LedgerRows(t, pool, account); n != 2 {
		t.Fatalf("%d ledger rows, want 2", n)
	}
}
