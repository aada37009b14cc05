// Package testdb opens the database of the integration tests, named by IDEM_TEST_DATABASE_URL (a database with
// CREATE EXTENSION idempotency and clients/schema.sql loaded). Without the variable the tests are skipped.
package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"example.com/idempotency"
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
	pool, err := idempotency.NewPool(ctx, url)
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
