package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
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
		{`{"amount_cents": 9007199254740991, "currency": "JPY"}`, 9007199254740991, "JPY", true},
		{`{"amount_cents": 9007199254740992, "currency": "JPY"}`, 0, "", false},
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
	if r := c.get("/healthz"); r.Status != 200 || r.Body != `{"ok":true}` || r.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("healthz: %+v", r)
	}
	for _, auth := range []string{"", "Bearer", "Bearer ", "Basic abc", "Bearer UPPER", "Bearer a-b",
		"Bearer " + strings.Repeat("a", 65), "Bearer a b"} {
		r := c.post("/payments", auth, ptr("k1"), `{"amount_cents": 1, "currency": "USD"}`, nil)
		if r.Status != 401 || r.ProblemType() != "unauthorized" || r.Header.Get("WWW-Authenticate") != "Bearer" {
			t.Errorf("Authorization %q: %+v", auth, r)
		}
	}
	if r := c.post("/payments", "Bearer alice", nil, `{}`, nil); r.Status != 400 || r.ProblemType() != "idempotency-key-missing" {
		t.Fatalf("no key: %+v", r)
	}
	if r := c.post("/payments", "Bearer alice", ptr(`"bad`), `{}`, nil); r.Status != 400 || r.ProblemType() != "idempotency-key-invalid" {
		t.Fatalf("bad key: %+v", r)
	}
	if r := c.get("/payments"); r.Status != 405 || r.Header.Get("Allow") != "POST" {
		t.Fatalf("GET /payments: %+v", r)
	}
	if r := c.post("/healthz", "", nil, `{}`, nil); r.Status != 405 || r.Header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST /healthz: %+v", r)
	}
	if r := c.post("/payments", "Bearer alice", ptr("k1,k2"), `{}`, nil); r.Status != 400 ||
		r.ProblemType() != "idempotency-key-invalid" || !strings.Contains(r.Body, "several") {
		t.Fatalf("two keys: %+v", r)
	}
	big := `{"amount_cents": 1, "currency": "USD"}` + strings.Repeat(" ", MaxBodyBytes)
	for _, path := range []string{"/payments", "/payments-unprotected"} {
		if r := c.post(path, "Bearer alice", ptr("k1"), big, nil); r.Status != 413 || r.ProblemType() != "request-too-large" {
			t.Fatalf("%s, a body over 1 MiB: %d %s", path, r.Status, r.Body)
		}
	}
	if r := c.get("/nope"); r.Status != 404 {
		t.Fatalf("GET /nope: %+v", r)
	}
}

type client struct {
	t   *testing.T
	url string
}

type result = testdb.Result

var ptr = testdb.Ptr

func (c client) get(path string) result {
	c.t.Helper()
	return testdb.Request(c.t, http.MethodGet, c.url+path, nil, "", nil)
}

// post sends body with the Authorization auth ("" sends none), the key (nil sends none) and the headers hdr.
func (c client) post(path, auth string, key *string, body string, hdr map[string]string) result {
	c.t.Helper()
	if auth != "" {
		with := map[string]string{"Authorization": auth}
		for k, v := range hdr {
			with[k] = v
		}
		hdr = with
	}
	return testdb.Request(c.t, http.MethodPost, c.url+path, key, body, hdr)
}

func mustHandler(t *testing.T, db idempotency.DB, cfg Config) http.Handler {
	h, err := NewHandler(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
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
// stored and replayed byte for byte with the debit kept; the 502 is sent and rolled back. Never a 200, and in
// every framework the same problem+json (type http-422, http-502).
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
			if first.Status != 422 || first.ProblemType() != "http-422" || second.Status != 422 ||
				second.Header.Get("Idempotent-Replayed") != "true" || second.Body != first.Body {
				t.Fatalf("throw-422: first %+v, replay %+v", first, second)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 1 {
				t.Fatalf("throw-422: %d ledger rows, want the debit sent with the 422", n)
			}
			account = testdb.Unique("acct_")
			auth = "Bearer " + account
			if r := c.post("/payments", auth, ptr(key), body, map[string]string{"X-Fault": "throw-502"}); r.Status != 502 || r.ProblemType() != "http-502" {
				t.Fatalf("throw-502: %+v", r)
			}
			if n := testdb.LedgerRows(t, pool, account); n != 0 {
				t.Fatalf("throw-502: %d ledger rows", n)
			}
			first = c.post("/payments", auth, ptr(key), body, nil)
			second = c.post("/payments", auth, ptr(key), body, nil)
			if first.Status != 201 || first.Header.Get("Idempotent-Replayed") != "" || second.Body != first.Body ||
				second.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("after throw-502: first %+v, replay %+v", first, second)
			}
			// Validation is answered not executed in every framework: the corrected request runs.
			key = testdb.Unique("pay-")
			if r := c.post("/payments", auth, ptr(key), `{"amount_cents": 0, "currency": "USD"}`, nil); r.Status != 422 || r.ProblemType() != "invalid-payment" {
				t.Fatalf("invalid: %+v", r)
			}
			if r := c.post("/payments", auth, ptr(key), body, nil); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("corrected: %+v", r)
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
	if r.Status != 201 {
		t.Fatalf("X-Fault without PAYMENTS_FAULTS=1: %+v", r)
	}
}

// CONTRACT.md "any-body", in every framework: a form or multipart payment is read by net/http's parsers after the
// middleware (which passes the bytes and the Content-Type to the claim), replays, and is another request with
// another content type (422); a body the handler cannot read is a not-executed 400 that frees the key; POST
// /documents stores any body as it came. Before 1.4 the middleware refused every non-JSON body with 400.
func TestAnyBodyEveryFramework(t *testing.T) {
	const form = "application/x-www-form-urlencoded"
	const multi = "multipart/form-data; boundary=b41"
	multipart := "--b41\r\nContent-Disposition: form-data; name=\"currency\"\r\n\r\nEUR\r\n" +
		"--b41\r\nContent-Disposition: form-data; name=\"amount_cents\"\r\n\r\n321\r\n--b41--\r\n"
	for _, fw := range Frameworks {
		t.Run(fw, func(t *testing.T) {
			pool, c := startFramework(t, fw)
			auth := "Bearer " + testdb.Unique("acct_")
			for _, tc := range []struct{ ctype, body string }{
				{form, "currency=EUR&amount_cents=321"}, {multi, multipart},
				{"text/plain", `{"amount_cents": 321, "currency": "EUR"}`},
			} {
				key := testdb.Unique("pay-")
				hdr := map[string]string{"Content-Type": tc.ctype}
				first := c.post("/payments", auth, ptr(key), tc.body, hdr)
				var p payment
				if first.Status != 201 || json.Unmarshal([]byte(first.Body), &p) != nil || p.AmountCents != 321 || p.Currency != "EUR" {
					t.Fatalf("%s: %+v", tc.ctype, first)
				}
				if again := c.post("/payments", auth, ptr(key), tc.body, hdr); !again.Replayed() || again.Body != first.Body {
					t.Fatalf("%s replay: %+v", tc.ctype, again)
				}
				other := map[string]string{"Content-Type": "application/octet-stream"}
				if r := c.post("/payments", auth, ptr(key), tc.body, other); r.Status != 422 || r.ProblemType() != "idempotency-key-reused" {
					t.Fatalf("%s as another type: %+v", tc.ctype, r)
				}
			}
			key := testdb.Unique("pay-")
			if r := c.post("/payments", auth, ptr(key), "one hundred euros", map[string]string{"Content-Type": "text/plain"}); r.Status != 400 || r.ProblemType() != "request-body-not-json" {
				t.Fatalf("text: %+v", r)
			}
			if r := c.post("/payments", auth, ptr(key), "amount_cents=1e2&currency=EUR", map[string]string{"Content-Type": form}); r.Status != 422 || r.ProblemType() != "invalid-payment" {
				t.Fatalf("form 1e2: %+v", r)
			}
			if r := c.post("/payments", auth, ptr(key), "amount_cents=100&currency=EUR", map[string]string{"Content-Type": form}); r.Status != 201 || r.Replayed() {
				t.Fatalf("corrected after two not-executed answers: %+v", r)
			}
			for _, tc := range []struct {
				ctype *string
				body  string
			}{{ptr("application/octet-stream"), "\x00\xff\x01binary"}, {nil, ""}, {ptr("text/plain; charset=utf-8"), "caf\u00e9\n"}} {
				key := testdb.Unique("doc-")
				hdr := map[string]string{"Content-Type": ""}
				if tc.ctype != nil {
					hdr["Content-Type"] = *tc.ctype
				}
				first := c.post("/documents", auth, ptr(key), tc.body, hdr)
				sum := sha256.Sum256([]byte(tc.body))
				var doc struct {
					ID          int64   `json:"document_id"`
					ContentType *string `json:"content_type"`
					Bytes       int     `json:"bytes"`
					SHA256      string  `json:"sha256"`
				}
				if first.Status != 201 || json.Unmarshal([]byte(first.Body), &doc) != nil || doc.Bytes != len(tc.body) ||
					doc.SHA256 != hex.EncodeToString(sum[:]) || fmt.Sprint(doc.ContentType) != fmt.Sprint(tc.ctype) && *doc.ContentType != *tc.ctype ||
					first.Header.Get("Location") != fmt.Sprintf("/documents/%d", doc.ID) {
					t.Fatalf("documents %v: %+v", tc.ctype, first)
				}
				if again := c.post("/documents", auth, ptr(key), tc.body, hdr); !again.Replayed() || again.Body != first.Body {
					t.Fatalf("documents %v replay: %+v", tc.ctype, again)
				}
				var stored []byte
				var ctype *string
				if err := pool.QueryRow(context.Background(), `SELECT body, content_type FROM documents WHERE id = $1`, doc.ID).Scan(&stored, &ctype); err != nil ||
					string(stored) != tc.body || (ctype == nil) != (tc.ctype == nil) {
					t.Fatalf("documents row %v: %q %v %v", tc.ctype, stored, ctype, err)
				}
			}
		})
	}
}
