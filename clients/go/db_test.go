package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// fixture is a guarded test handler that debits the ledger of a fresh scope.
type fixture struct {
	t     *testing.T
	pool  *pgxpool.Pool
	scope string
	runs  atomic.Int32 // handler runs
	// behave decides what the handler does after its insert; nil answers 201 JSON.
	behave func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
	srv    *httptest.Server
}

func newFixture(t *testing.T, opts idempotency.Options) *fixture {
	f := &fixture{t: t, pool: testdb.Pool(t), scope: testdb.Unique("go_mw_")}
	opts.Scope = func(*http.Request) string { return f.scope }
	if opts.Logger == nil {
		opts.Logger = log.New(io.Discard, "", 0)
	}
	g := idempotency.New(f.pool, opts)
	f.srv = httptest.NewServer(g.HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		f.runs.Add(1)
		var id int64
		err := tx.QueryRow(r.Context(), `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -100, 'USD', $2::text) RETURNING id`, idempotency.Scope(r.Context()), idempotency.Key(r.Context())).Scan(&id)
		if err != nil {
			return err
		}
		if f.behave != nil {
			return f.behave(w, r, tx)
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/things/%d", id))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id": %d, "echo": %s}`, id, body)
		return nil
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) post(key *string, body string) testdb.Result {
	f.t.Helper()
	return testdb.Request(f.t, http.MethodPost, f.srv.URL+"/things", key, body, nil)
}

var ptr = testdb.Ptr

func (f *fixture) rows() int { return testdb.LedgerRows(f.t, f.pool, f.scope) }

// A retry with the same key replays the first answer byte for byte (status, headers, body) without running the
// handler again, pipelined or not; the key's one ledger row carries the key as parsed.
func TestReplay(t *testing.T) {
	for _, tc := range []struct {
		name              string
		key, first, retry string // the key as parsed, and how each request sends it: "quoted", or "" as it is
		body, retryBody   string
		status            int
		contentType, sent string // the answer's Content-Type, and its body when the test handler writes it
		behave            idempotency.TxHandlerFunc
	}{
		// The same key, quoted the second time, and the body with other key order and spacing: the same request.
		{name: "created", key: testdb.Unique("k"), retry: "quoted", body: `{"a": 1, "b": [1, 2]}`,
			retryBody: `{ "b":[1,2],"a":1 }`, status: 201, contentType: "application/json"},
		{name: "a stored 4xx", key: testdb.Unique("k"), body: `{}`, status: 402, contentType: "text/plain",
			sent: "insufficient funds\n", behave: func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				w.Header().Set("Content-Type", "text/plain")
				w.WriteHeader(402)
				_, _ = io.WriteString(w, "insufficient funds\n")
				return nil
			}},
		// The bytes written are the bytes sent and stored: odd spacing and key order kept, Content-Length the same.
		{name: "JSON as written", key: testdb.Unique("k"), body: `{}`, status: 201, contentType: "application/json",
			sent: `{"z":1,   "a":{"b":[1,2.50]},"s":"\u00e9"}`, behave: func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(201)
				_, _ = io.WriteString(w, `{"z":1,   "a":{"b":[1,2.50]},"s":"\u00e9"}`)
				return nil
			}},
		// Keys and bodies with quotes and backslashes survive the simple protocol's client-side interpolation.
		{name: "quotes and backslashes", key: testdb.Unique(`it's\a"key`), first: "quoted", retry: "quoted",
			body: `{"note": "O'Brien said \"hi\" \\ bye", "emoji": "\u00e9\ud83d\ude00"}`, status: 201,
			contentType: "application/json"},
	} {
		for _, noPipeline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/NoPipeline=%v", tc.name, noPipeline), func(t *testing.T) {
				f := newFixture(t, idempotency.Options{NoPipeline: noPipeline})
				f.behave = tc.behave
				send := func(form string) *string {
					if form == "quoted" {
						return ptr(`"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(tc.key) + `"`)
					}
					return ptr(tc.key)
				}
				retryBody := tc.retryBody
				if retryBody == "" {
					retryBody = tc.body
				}
				first := f.post(send(tc.first), tc.body)
				second := f.post(send(tc.retry), retryBody)
				if first.Status != tc.status || first.Replayed() || second.Status != tc.status || !second.Replayed() ||
					second.Body != first.Body || (tc.sent != "" && first.Body != tc.sent) {
					t.Fatalf("first %+v, replay %+v", first, second)
				}
				for _, h := range []string{"Content-Type", "Location", "Content-Length"} {
					if second.Header.Get(h) != first.Header.Get(h) {
						t.Fatalf("%s: first %q, replay %q", h, first.Header.Get(h), second.Header.Get(h))
					}
				}
				if second.Header.Get("Content-Type") != tc.contentType || second.Header.Get(idempotency.BodyEncodingHeader) != "" ||
					(second.Header.Get("Location") != "") != (tc.behave == nil) {
					t.Fatalf("replay headers %v", second.Header)
				}
				var stored string
				err := f.pool.QueryRow(context.Background(), `SELECT idempotency_key FROM ledger WHERE account = $1::text`, f.scope).Scan(&stored)
				if err != nil || stored != tc.key || f.runs.Load() != 1 {
					t.Fatalf("ledger key %q (%v), want %q, its only row; handler runs %d, want 1", stored, err, tc.key, f.runs.Load())
				}
			})
		}
	}
}

// The same key with another body is refused (422, the handler not run); in another scope it is another key.
func TestSameKeyOtherRequest(t *testing.T) {
	for _, other := range []string{"body", "scope"} {
		t.Run("another "+other, func(t *testing.T) {
			f := newFixture(t, idempotency.Options{})
			key, body := testdb.Unique("k"), `{"amount": 100}`
			if r := f.post(ptr(key), body); r.Status != 201 {
				t.Fatalf("first: %+v", r)
			}
			if other == "body" {
				body = `{"amount": 1000}`
			} else {
				f.scope = testdb.Unique("go_mw_")
			}
			r := f.post(ptr(key), body)
			if other == "body" && (r.Status != 422 || r.ProblemType() != "idempotency-key-reused" || f.runs.Load() != 1) ||
				other == "scope" && (r.Status != 201 || r.Replayed() || f.runs.Load() != 2) || f.rows() != 1 {
				t.Fatalf("%+v, handler runs %d, ledger rows %d", r, f.runs.Load(), f.rows())
			}
		})
	}
}

func TestKeyAndBodyErrors(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	for _, tc := range []struct {
		key  *string
		body string
		slug string
	}{
		{nil, `{}`, "idempotency-key-missing"},
		{ptr(""), `{}`, "idempotency-key-invalid"},
		{ptr(`"unterminated`), `{}`, "idempotency-key-invalid"},
		{ptr(strings.Repeat("x", 256)), `{}`, "idempotency-key-invalid"},
		{ptr("a b"), `{}`, "idempotency-key-invalid"},
		{ptr(testdb.Unique("k")), `not json`, "request-body-not-json"},
		{ptr(testdb.Unique("k")), ``, "request-body-not-json"},
		{ptr(testdb.Unique("k")), `{"a": "\u0000"}`, "request-body-not-json"},
	} {
		r := f.post(tc.key, tc.body)
		if r.Status != 400 || r.ProblemType() != tc.slug {
			t.Errorf("key %v body %q: %d %s, want 400 %s", tc.key, tc.body, r.Status, r.Body, tc.slug)
		}
	}
	if f.runs.Load() != 0 {
		t.Fatalf("the handler ran %d times", f.runs.Load())
	}
	// A refused body does not consume the key.
	key := testdb.Unique("k")
	if r := f.post(ptr(key), `{oops`); r.Status != 400 {
		t.Fatalf("%+v", r)
	}
	if r := f.post(ptr(key), `{"ok": true}`); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after a bad body the key is still free: %+v", r)
	}
}

// A failed or refused request leaves nothing behind: its answer is sent, not stored, no ledger row stays, and the
// retry with the same key (and another body: nothing of the first was kept) runs the handler again.
func TestNotCached(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		slug   string
		behave idempotency.TxHandlerFunc
	}{
		{"a 5xx", 503, "upstream-unavailable", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			idempotency.Problem("", 503, "upstream-unavailable", "Service Unavailable", "upstream unavailable").Write(w)
			return nil
		}},
		{"a panic", 500, "internal-error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			w.WriteHeader(201)
			panic("boom")
		}},
		{"a statement error", 500, "internal-error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `SELECT 1/0`)
			return err
		}},
		// A handler that ignores a failed statement and answers 201: idem_complete fails in the aborted transaction.
		{"an ignored statement error", 500, "internal-error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_, _ = tx.Exec(r.Context(), `SELECT 1/0`)
			w.WriteHeader(201)
			return nil
		}},
		// No status written: what the client would get is up to code after the middleware (net/http's implicit
		// 200), so the middleware rolls back and answers 500.
		{"no response", 500, "internal-error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			w.Header().Set("Content-Type", "application/json") // a header alone is not a response
			return nil
		}},
		// The handler rolled back the pipelined transaction it was given.
		{"the handler rolled back", 500, "internal-error", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			if err := tx.Rollback(r.Context()); err != nil {
				return err
			}
			w.WriteHeader(201)
			return nil
		}},
		// NotExecuted: the handler refused the request before doing anything; the corrected request runs.
		{"not executed", 422, "invalid-payment", func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			idempotency.NotExecuted(r.Context())
			idempotency.Problem("", 422, "invalid-payment", "Invalid payment", "bad").Write(w)
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, idempotency.Options{})
			f.behave = tc.behave
			key := testdb.Unique("k")
			if r := f.post(ptr(key), `{"n": 1}`); r.Status != tc.status || r.ProblemType() != tc.slug {
				t.Fatalf("failing request: %d %s, want %d %s", r.Status, r.Body, tc.status, tc.slug)
			}
			if f.rows() != 0 {
				t.Fatalf("the failed request left %d ledger rows", f.rows())
			}
			f.behave = nil
			if r := f.post(ptr(key), `{"n": 2}`); r.Status != 201 || r.Replayed() {
				t.Fatalf("retry after the failure: %+v", r)
			}
			if f.runs.Load() != 2 || f.rows() != 1 {
				t.Fatalf("handler runs %d, ledger rows %d; want 2 and 1", f.runs.Load(), f.rows())
			}
		})
	}
}

func TestInProgress(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	key := testdb.Unique("k")
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var outcome string
	if err := tx.QueryRow(ctx, `SELECT outcome FROM idem_claim($1::text, idem_hash('x'::text), NULL, $2::text)`, key, f.scope).Scan(&outcome); err != nil || outcome != "claimed" {
		t.Fatalf("claim in the other transaction: %q %v", outcome, err)
	}
	r := f.post(ptr(key), `{}`)
	if r.Status != 409 || r.Header.Get("Retry-After") != "1" || r.ProblemType() != "idempotency-key-in-progress" {
		t.Fatalf("while held elsewhere: %+v", r)
	}
	if f.runs.Load() != 0 {
		t.Fatal("the handler ran")
	}
	_ = tx.Rollback(ctx)
	if r := f.post(ptr(key), `{}`); r.Status != 201 {
		t.Fatalf("after the other transaction rolled back: %+v", r)
	}
}

func TestSerializationFailureRetried(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	var attempts []int
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		attempts = append(attempts, idempotency.Attempt(r.Context()))
		if idempotency.Attempt(r.Context()) < 2 {
			// A real 40001 from the server, wrapped as handlers do.
			_, err := tx.Exec(r.Context(), testdb.SerializationFailure)
			return fmt.Errorf("debit: %w", err)
		}
		w.WriteHeader(201)
		return nil
	}
	if r := f.post(ptr(testdb.Unique("k")), `{}`); r.Status != 201 {
		t.Fatalf("%+v", r)
	}
	if fmt.Sprint(attempts) != "[0 1 2]" || f.rows() != 1 {
		t.Fatalf("attempts %v, rows %d; want [0 1 2] and 1", attempts, f.rows())
	}
}

func TestRetriesExhausted(t *testing.T) {
	f := newFixture(t, idempotency.Options{MaxRetries: 2})
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		return &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	}
	r := f.post(ptr(testdb.Unique("k")), `{}`)
	if r.Status != 409 || r.Header.Get("Retry-After") != "1" || r.ProblemType() != "transaction-conflict" {
		t.Fatalf("%+v", r)
	}
	if f.runs.Load() != 3 || f.rows() != 0 {
		t.Fatalf("runs %d rows %d; want 3 and 0", f.runs.Load(), f.rows())
	}
}

// The plain net/http form: the transaction from the context, Fail for errors.
func TestMiddlewareForm(t *testing.T) {
	pool := testdb.Pool(t)
	scope := testdb.Unique("go_mw_")
	var fail atomic.Bool
	mw := idempotency.Middleware(pool, idempotency.Options{
		Scope:  func(*http.Request) string { return scope },
		Logger: log.New(io.Discard, "", 0),
	})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := idempotency.Tx(r.Context())
		if tx == nil {
			w.WriteHeader(http.StatusTeapot) // not guarded: GET
			return
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -5, 'EUR', $2::text)`, scope, idempotency.Key(r.Context())); err != nil {
			idempotency.Fail(r.Context(), err)
			return
		}
		if fail.Load() {
			idempotency.Fail(r.Context(), errors.New("downstream failed"))
			w.WriteHeader(200) // dropped
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	})))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	if err != nil || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("GET passes through: %v %v", resp, err)
	}
	resp.Body.Close()

	key := testdb.Unique("k")
	fail.Store(true)
	if r := testdb.Post(t, srv.URL, key, `{}`); r.Status != 500 {
		t.Fatalf("Fail: %+v", r)
	}
	fail.Store(false)
	if r := testdb.Post(t, srv.URL, key, `{}`); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("after Fail: %+v", r)
	}
	if r := testdb.Post(t, srv.URL, key, `{}`); r.Status != 200 || r.Header.Get("Idempotent-Replayed") != "true" || r.Body != `{"ok":true}` {
		t.Fatalf("replay: %+v", r)
	}
	if n := testdb.LedgerRows(t, pool, scope); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

// NewPool prepares the statements (pgx's statement cache, or named by their text): after the requests on its one
// connection, the claim and the completion are prepared there once each. With prefer_simple_protocol=true (what
// NewPool picks behind a pooler, BehindPooler) the connection has no statement cache and the server no statement
// of ours. Options.TTL (an interval parameter) is the keys' lifetime, Options.TxOptions the transaction's. The
// handler fails, or answers with no statement (the completion or the rollback follows the claim's BEGIN), or
// fails sending one, or debits; a replay ends the sequence: each leaves the one connection, or a new one, ready for
// the next request.
func TestPreparedStatements(t *testing.T) {
	testdb.Pool(t) // skips without a database
	ctx := context.Background()
	url := os.Getenv(testdb.Env)
	if cfg, err := pgx.ParseConfig(url); err != nil {
		t.Fatal(err)
	} else if pooled, err := idempotency.BehindPooler(ctx, cfg); err != nil || pooled {
		t.Fatalf("BehindPooler of a direct connection: %v %v", pooled, err)
	}
	sep := map[bool]string{false: "?", true: "&"}[strings.Contains(url, "?")]
	for _, tc := range []struct {
		opt  string
		iso  pgx.TxIsoLevel
		want int
	}{{"", "", 2}, {"", pgx.Serializable, 2}, {"&prefer_simple_protocol=true", "", 0}} {
		pool, err := idempotency.NewPool(ctx, url+sep+"pool_max_conns=1"+tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if pool.Config().ConnConfig.PreferSimpleProtocol != (tc.want == 0) {
			t.Fatalf("%+v: PreferSimpleProtocol %v", tc, pool.Config().ConnConfig.PreferSimpleProtocol)
		}
		scope, iso := testdb.Unique("go_prep_"), map[bool]string{true: "read committed"}[tc.iso == ""]+string(tc.iso)
		g := idempotency.New(pool, idempotency.Options{Scope: func(*http.Request) string { return scope }, TTL: 90 * time.Minute,
			TxOptions: pgx.TxOptions{IsoLevel: tc.iso}, Logger: log.New(io.Discard, "", 0)})
		srv := httptest.NewServer(g.HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			switch body, _ := io.ReadAll(r.Body); string(body) {
			case `"fail"`:
				return errors.New("failed before any statement")
			case `"nothing"`:
				w.WriteHeader(http.StatusCreated)
				return nil
			case `"cancelled"`: // a statement that cannot be sent, maybe before the claim's BEGIN was answered
				ctx, cancel := context.WithCancel(r.Context())
				cancel()
				_, err := tx.Exec(ctx, `SELECT 1`)
				return err
			}
			var got string
			if err := tx.QueryRow(r.Context(), `SELECT current_setting('transaction_isolation')`).Scan(&got); err != nil || got != iso {
				return fmt.Errorf("isolation %q (%v), want %q", got, err, iso)
			}
			w.WriteHeader(http.StatusCreated)
			return testdb.Debit(r.Context(), tx, scope, idempotency.Key(r.Context()))
		}))
		defer srv.Close()
		key := ""
		for _, body := range []string{`"fail"`, `"nothing"`, `{}`, `"cancelled"`, `{}`, `"fail"`, `"nothing"`} {
			key = testdb.Unique("k")
			if r := testdb.Post(t, srv.URL, key, body); r.Status != map[bool]int{true: 500, false: 201}[body == `"fail"` || body == `"cancelled"`] {
				t.Fatalf("%+v, %s: %+v", tc, body, r)
			}
		}
		if r := testdb.Post(t, srv.URL, key, `"nothing"`); r.Status != 201 || !r.Replayed() {
			t.Fatalf("%+v, the replay: %+v", tc, r)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements
WHERE statement LIKE 'SELECT idem_claim_request(%' OR statement LIKE 'SELECT idem_complete_request(%'`).Scan(&n); err != nil || n != tc.want {
			t.Fatalf("%+v: %d prepared statements of ours, want %d (%v)", tc, n, tc.want, err)
		}
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = $1
AND expires_at BETWEEN now() + interval '89 minutes' AND now() + interval '91 minutes'`, scope).Scan(&n); err != nil || n != 4 {
			t.Fatalf("%+v: %d keys of 90 minutes, want 4 (%v)", tc, n, err)
		}
	}
}

// The pipelined transaction given to handlers: savepoints work, Commit is refused (the middleware commits after
// storing the response). Its Rollback: TestNotCached.
func TestPipelinedTx(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		ctx := r.Context()
		if err := tx.BeginFunc(ctx, func(sp pgx.Tx) error {
			if _, err := sp.Exec(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -1, 'USD', 'savepoint')`, f.scope); err != nil {
				return err
			}
			return errors.New("undo the savepoint")
		}); err == nil || err.Error() != "undo the savepoint" {
			return err
		}
		if err := tx.Commit(ctx); err == nil {
			return errors.New("the handler could commit the request's transaction")
		}
		w.WriteHeader(201)
		return nil
	}
	key := testdb.Unique("k")
	if r := f.post(ptr(key), `{}`); r.Status != 201 {
		t.Fatalf("%+v", r)
	}
	if f.rows() != 1 { // the handler's insert; the savepoint's was rolled back
		t.Fatalf("%d rows", f.rows())
	}
}
