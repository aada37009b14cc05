// Package testdb opens the database of the integration tests, named by IDEM_TEST_DATABASE_URL (a database with
// CREATE EXTENSION idempotency and clients/schema.sql loaded). Without the variable the tests are skipped.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"example.com/idempotency"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Env names the database URL.
const Env = "IDEM_TEST_DATABASE_URL"

// Pool connects (simple protocol, as the service does) or skips t when Env is unset. The pool is closed when t
// ends. It fails t when the database lacks the extension or the ledger table.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := os.Getenv(Env)
	if url == "" {
		t.Skip(Env + " is not set: skipping the database test")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// One connection kept open, not NewPool's eight: the tests open many short-lived pools.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, err := idempotency.NewPool(ctx, url+sep+"pool_min_conns=1")
	if err != nil {
		t.Fatalf("connect %s: %v", Env, err)
	}
	t.Cleanup(pool.Close)
	var ok bool
	err = pool.QueryRow(ctx, `SELECT to_regproc('idem_claim') IS NOT NULL AND to_regclass('ledger') IS NOT NULL`).Scan(&ok)
	if err != nil || !ok {
		t.Fatalf("the test database needs CREATE EXTENSION idempotency and clients/schema.sql (%v)", err)
	}
	return pool
}

// Unique is a fresh name with prefix, for accounts, scopes and keys that no other run uses.
func Unique(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// LedgerRows counts the ledger rows of account.
func LedgerRows(t testing.TB, pool *pgxpool.Pool, account string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE account = $1::text`, account).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Result is an HTTP answer read whole.
type Result struct {
	Status int
	Header http.Header
	Body   string
}

// Replayed reports whether the answer carries Idempotent-Replayed: true.
func (r Result) Replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// Post sends a JSON body to url with the Idempotency-Key key ("" sends none).
func Post(t testing.TB, url, key, body string) Result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Result{resp.StatusCode, resp.Header, string(b)}
}

// Debit inserts a ledger row for account in tx, as the payment handler does.
func Debit(ctx context.Context, tx pgx.Tx, account, key string) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -100, 'USD', $2::text)`, account, key)
	return err
}
