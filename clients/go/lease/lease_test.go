package lease_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"testing"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/idempotency-pg/idempotency/clients/go/lease"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// writesTable makes a table of the test's own for Finish's local writes.
func writesTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := testdb.Unique("lease_writes_")
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+name+" (key text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+name) })
	return name
}

func writes(t *testing.T, pool *pgxpool.Pool, table string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func request() lease.Request {
	return lease.Request{Key: testdb.Unique("lease-"), Scope: testdb.Unique("tenant_"), Method: "POST",
		Path: "/rides", Body: []byte(`{"amount_cents": 100}`)}
}

// A 5xx from Finish stores nothing and keeps none of Finish's writes: the retry runs Finish again and the writes
// happen once (as the transactional middleware rolls a 5xx back). The lease is released at once, with the
// recovery point of the steps before kept.
func TestFinishServerErrorRollsBackItsWrites(t *testing.T) {
	pool := testdb.Pool(t)
	table := writesTable(t, pool)
	rn := &lease.Runner{Pool: pool, Lease: 5 * time.Second, Logger: log.New(io.Discard, "", 0)}
	req := request()
	prepared := 0
	status := http.StatusServiceUnavailable
	steps := []lease.Step{
		{Name: "prepare", Do: func(ctx context.Context, r *lease.Run) error {
			prepared++
			return nil
		}},
		{Name: "finish", Do: func(ctx context.Context, r *lease.Run) error {
			return r.Finish(ctx, func(tx pgx.Tx) (*idempotency.Response, error) {
				if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", req.Key); err != nil {
					return nil, err
				}
				return &idempotency.Response{Status: status, Header: http.Header{}, Body: []byte(`{"ok":false}`)}, nil
			})
		}},
	}
	if resp := rn.Run(context.Background(), req, steps); resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("first run: %d %s", resp.Status, resp.Body)
	}
	if n := writes(t, pool, table); n != 0 {
		t.Fatalf("a 5xx kept %d of Finish's writes", n)
	}
	status = http.StatusCreated
	resp := rn.Run(context.Background(), req, steps) // at once: the 5xx released the lease
	if resp.Status != http.StatusCreated {
		t.Fatalf("retry: %d %s", resp.Status, resp.Body)
	}
	if n := writes(t, pool, table); n != 1 || prepared != 1 {
		t.Fatalf("after the retry: %d writes, prepare ran %d times (want 1 and 1: resumed after prepare)", n, prepared)
	}
	if replay := rn.Run(context.Background(), req, steps); replay.Status != http.StatusCreated ||
		replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", replay.Status, replay.Header)
	}
}

// Once Finish has stored the response, the lease is over; a heartbeat that extends it after that gets 55000, which
// must not turn the stored answer into a 409.
func TestHeartbeatAfterFinishKeepsTheAnswer(t *testing.T) {
	pool := testdb.Pool(t)
	lease_ := 300 * time.Millisecond // the heartbeat ticks every 100 ms
	rn := &lease.Runner{Pool: pool, Lease: lease_, Logger: log.New(io.Discard, "", 0)}
	req := request()
	steps := []lease.Step{{Name: "finish", Do: func(ctx context.Context, r *lease.Run) error {
		if err := r.Finish(ctx, func(tx pgx.Tx) (*idempotency.Response, error) {
			return &idempotency.Response{Status: http.StatusCreated, Header: http.Header{}, Body: []byte(`{"ok":true}`)}, nil
		}); err != nil {
			return err
		}
		// Several heartbeat ticks after the completion (each extend answers 55000 now); the margin holds on
		// busy cores, where a tick may come late but not never in a second.
		time.Sleep(time.Second)
		return nil
	}}}
	if resp := rn.Run(context.Background(), req, steps); resp.Status != http.StatusCreated {
		t.Fatalf("a completed request answered %d %s", resp.Status, resp.Body)
	}
}
