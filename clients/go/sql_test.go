package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
)

// The database/sql Guard, pipelined (the handler's Querier is the request's *sql.Conn) and not (a *sql.Tx): the
// same protocol as the pgx one.
func TestDatabaseSQL(t *testing.T) {
	pool := testdb.Pool(t) // skips without a database; counts rows
	for _, noPipeline := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoPipeline=%v", noPipeline), func(t *testing.T) {
			db, err := idempotency.OpenSQL(os.Getenv(testdb.Env))
			if err != nil {
				t.Fatal(err)
			}
			db.SetMaxOpenConns(4)
			defer db.Close()
			account := testdb.Unique("go_sql_")
			var runs atomic.Int32
			var behave atomic.Value // "ok", "502", "error", "conflict-once"
			behave.Store("ok")
			g := idempotency.NewSQL(db, idempotency.Options{
				Scope:      func(*http.Request) string { return account },
				NoPipeline: noPipeline,
				Logger:     log.New(io.Discard, "", 0),
			})
			srv := httptest.NewServer(g.HandleSQL(func(w http.ResponseWriter, r *http.Request, q idempotency.Querier) error {
				runs.Add(1)
				ctx := r.Context()
				if _, ok := q.(*sql.Tx); ok != noPipeline {
					return fmt.Errorf("the handler got a %T", q)
				}
				var id int64
				if err := q.QueryRowContext(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1, -100, 'USD', $2) RETURNING id`, account, idempotency.Key(ctx)).Scan(&id); err != nil {
					return err
				}
				switch behave.Load().(string) {
				case "502":
					w.WriteHeader(http.StatusBadGateway)
					return nil
				case "error":
					return errors.New("provider failed")
				case "conflict-once":
					if idempotency.Attempt(ctx) == 0 {
						_, err := q.ExecContext(ctx, testdb.SerializationFailure)
						return err
					}
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, err := fmt.Fprintf(w, `{"id":%d,  "b": 1, "a": 2}`, id)
				return err
			}))
			defer srv.Close()
			rows := func() int { return testdb.LedgerRows(t, pool, account) }

			key := testdb.Unique("k")
			first := testdb.Post(t, srv.URL, key, `{"x": 1}`)
			second := testdb.Post(t, srv.URL, key, `{ "x":1 }`)
			if first.Status != 201 || !second.Replayed() || second.Body != first.Body || rows() != 1 || runs.Load() != 1 {
				t.Fatalf("first %+v, replay %+v, rows %d, runs %d", first, second, rows(), runs.Load())
			}
			for _, b := range []string{"502", "error"} {
				behave.Store(b)
				key := testdb.Unique("k")
				r := testdb.Post(t, srv.URL, key, `{}`)
				if (b == "502" && r.Status != 502) || (b == "error" && r.Status != 500) || rows() != 1 {
					t.Fatalf("%s: %+v, rows %d", b, r, rows())
				}
				behave.Store("ok")
				if r := testdb.Post(t, srv.URL, key, `{}`); r.Status != 201 || r.Replayed() || rows() != 2 {
					t.Fatalf("%s, then the retry: %+v, rows %d", b, r, rows())
				}
				if _, err := pool.Exec(context.Background(), `DELETE FROM ledger WHERE account = $1::text AND idempotency_key = $2::text`, account, key); err != nil {
					t.Fatal(err)
				}
			}
			behave.Store("conflict-once")
			runs.Store(0)
			if r := testdb.Post(t, srv.URL, testdb.Unique("k"), `{}`); r.Status != 201 || runs.Load() != 2 || rows() != 2 {
				t.Fatalf("40001 once: %+v, runs %d, rows %d", r, runs.Load(), rows())
			}
			// Every connection went back to the pool idle: a plain query on each works.
			for i := 0; i < 4; i++ {
				var one int
				if err := db.QueryRow(`SELECT 1`).Scan(&one); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
