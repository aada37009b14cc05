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
	var stored int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = $1 AND scope = $2
  AND (http_status IS NOT NULL OR response_bytes IS NOT NULL)`, req.Key, req.Scope).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("a 5xx stored %d responses (%v)", stored, err)
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

// What Finish answers is stored as it is, with its content type (idem_lease_complete_request): the first answer and
// the replay are those bytes, JSON included (jsonb would respell it: key order, spacing, 1e2), and bytes that are
// no text.
func TestTheBytesAnsweredReplay(t *testing.T) {
	// Also under settings that change how values are written as text (bytea_output = 'escape', ...), prepared and
	// with the simple protocol a pooler gets, where every column comes as text: the body was read as bytea's text,
	// which pgx takes only in hex. The lease and the key expire when they should, whatever the TimeZone and
	// IntervalStyle.
	plain := testdb.Pool(t)
	for _, params := range []string{"", testdb.HostileSettings, testdb.HostileSettings + "&prefer_simple_protocol=true"} {
		rn := &lease.Runner{Pool: testdb.PoolWith(t, params), Lease: 50 * time.Second, TTL: 3 * time.Hour,
			Logger: log.New(io.Discard, "", 0)}
		for _, tc := range [][2]string{{"application/json", `{"b": 2,  "a": [1.0, 1e2]}`},
			{"text/plain; charset=utf-8", "caf\u00e9\n"}, {"image/png", "\x89PNG\r\n\x1a\n\x00\xff\\x41\\"}} {
			req := request()
			var leaseLeft, ttlLeft float64
			steps := []lease.Step{{Name: "finish", Do: func(ctx context.Context, r *lease.Run) error {
				if err := plain.QueryRow(ctx, `SELECT extract(epoch FROM lease_until - now())::float8,
  extract(epoch FROM expires_at - now())::float8 FROM idempotency_keys WHERE key = $1::text AND scope = $2::text`,
					req.Key, req.Scope).Scan(&leaseLeft, &ttlLeft); err != nil {
					return err
				}
				return r.Finish(ctx, func(pgx.Tx) (*idempotency.Response, error) {
					return &idempotency.Response{Status: http.StatusCreated, Body: []byte(tc[1]),
						Header: http.Header{"Content-Type": {tc[0]}, "Location": {"/x"}}}, nil
				})
			}}}
			first, again := rn.Run(context.Background(), req, steps), rn.Run(context.Background(), req, nil)
			if string(first.Body) != tc[1] || again.Status != http.StatusCreated || string(again.Body) != tc[1] ||
				again.Header.Get("Content-Type") != tc[0] || again.Header.Get("Location") != "/x" ||
				again.Header.Get(idempotency.ReplayedHeader) != "true" {
				t.Errorf("%q, %s: answered %q, replayed %d %v %q", params, tc[0], first.Body, again.Status, again.Header, again.Body)
			}
			if leaseLeft < 20 || leaseLeft > 50 || ttlLeft < 3*3600-120 || ttlLeft > 3*3600+50 {
				t.Errorf("%q, %s: the lease ran out in %.0f s (want 50), the key in %.0f s (want 3 h)", params, tc[0], leaseLeft, ttlLeft)
			}
		}
	}
}

// A key completed through the jsonb form (idem_lease_complete, as 1.2's runner stored a response: JSON as jsonb, a
// text body as a JSON string with its encoding in a header, no body at all) still replays.
func TestAKeyCompletedAsJSONBReplays(t *testing.T) {
	pool := testdb.Pool(t)
	rn := &lease.Runner{Pool: pool, Lease: 5 * time.Second, Logger: log.New(io.Discard, "", 0)}
	ctx := context.Background()
	for _, tc := range []struct{ body, headers, contentType, want string }{
		{`{"b": 2,  "a": 1}`, `{"Content-Type": "application/json"}`, "application/json", `{"a": 1, "b": 2}`},
		{`"caf\u00e9\n"`, `{"Content-Type": "text/plain", "Idempotency-Body-Encoding": "text"}`, "text/plain", "caf\u00e9\n"},
		{"", `{}`, "", ""},
	} {
		req := request()
		var token string
		if err := pool.QueryRow(ctx, `SELECT lease_token::text FROM idem_lease($1::text,
  idem_fingerprint($2::text, $3::text, NULL, NULL, $4::bytea), '5 s', NULL, $5::text)`,
			req.Key, req.Method, req.Path, req.Body, req.Scope).Scan(&token); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, `SELECT idem_lease_complete($1::text, $2::uuid, 201, nullif($3::text, '')::jsonb,
  $4::jsonb, $5::text)`, req.Key, token, tc.body, tc.headers, req.Scope); err != nil {
			t.Fatal(err)
		}
		again := rn.Run(ctx, req, nil)
		if again.Status != http.StatusCreated || string(again.Body) != tc.want || again.Header.Get("Content-Type") != tc.contentType ||
			again.Header.Get(idempotency.BodyEncodingHeader) != "" || again.Header.Get(idempotency.ReplayedHeader) != "true" {
			t.Errorf("%s: replayed %d %v %q", tc.body, again.Status, again.Header, again.Body)
		}
	}
}
