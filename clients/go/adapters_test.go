package idempotency_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"example.com/idempotency"
	"example.com/idempotency/internal/testdb"
	"github.com/jackc/pgx/v4"
)

// A handler that returns without writing anything: the middleware did not see a status, so it rolls back and
// answers 500 instead of committing the implicit 200 net/http would send.
func TestNoResponseRollsBack(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("Content-Type", "application/json") // a header alone is not a response
		return nil
	}
	expectNotCached(t, f, 500, "internal-error")
}

// NotExecuted: the handler refused the request before doing anything. Its 422 is sent, not stored; the key is
// free, so the corrected request with the same key runs.
func TestNotExecutedIsNotStored(t *testing.T) {
	f := newFixture(t, idempotency.Options{})
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "bad") {
			idempotency.NotExecuted(r.Context())
			idempotency.Problem("", 422, "invalid-payment", "Invalid payment", "bad").Write(w)
			return nil
		}
		w.WriteHeader(201)
		return nil
	}
	key := testdb.Unique("k")
	if r := f.post(ptr(key), `{"v": "bad"}`); r.Status != 422 || r.ProblemType() != "invalid-payment" {
		t.Fatalf("%+v", r)
	}
	if f.rows() != 0 {
		t.Fatalf("%d rows after a request not executed", f.rows())
	}
	if r := f.post(ptr(key), `{"v": "good"}`); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the corrected request with the same key: %+v", r)
	}
	if f.rows() != 1 {
		t.Fatalf("%d rows", f.rows())
	}
}

// The first answer is the stored form: a JSON body written with odd spacing and key order is sent as jsonb gives
// it back, so the replay is byte for byte the same, Content-Length included.
func TestReplayIsByteIdentical(t *testing.T) {
	for _, noPipeline := range []bool{false, true} {
		f := newFixture(t, idempotency.Options{NoPipeline: noPipeline})
		f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			_, _ = io.WriteString(w, `{"z":1,   "a":{"b":[1,2.50]},"s":"\u00e9"}`)
			return nil
		}
		key := testdb.Unique("k")
		first := f.post(ptr(key), `{}`)
		second := f.post(ptr(key), `{}`)
		if first.Status != 201 || second.Header.Get("Idempotent-Replayed") != "true" || first.Body != second.Body ||
			first.Header.Get("Content-Length") != second.Header.Get("Content-Length") {
			t.Fatalf("NoPipeline %v: first %q %v, replay %q %v", noPipeline, first.Body, first.Header, second.Body, second.Header)
		}
	}
}

// The pipelined transaction given to handlers: savepoints work, Commit is refused (the middleware commits after
// storing the response), Rollback ends the request with 500 and nothing stored.
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
	f.behave = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := tx.Rollback(r.Context()); err != nil {
			return err
		}
		w.WriteHeader(201)
		return nil
	}
	if r := f.post(ptr(testdb.Unique("k")), `{}`); r.Status != 500 {
		t.Fatalf("after the handler rolled back: %+v", r)
	}
	if f.rows() != 1 {
		t.Fatalf("%d rows", f.rows())
	}
}
