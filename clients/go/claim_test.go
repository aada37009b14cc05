package idempotency_test

import (
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// claimFixture: one guard over a single connection through testdb.Proxy (claim first over prepared statements,
// the default), one over a direct pool, both in one fresh scope, with a handler that counts its runs before it
// touches the database (as a handler that calls a provider first would).
type claimFixture struct {
	proxy           *testdb.Proxy
	viaProxy, plain *httptest.Server
	runs            atomic.Int32
	pool            *pgxpool.Pool
	app             string // the application_name of the connection through the proxy
}

func newClaimFixture(t *testing.T, opts idempotency.Options) *claimFixture {
	f := &claimFixture{proxy: testdb.NewProxy(t), app: testdb.Unique("go_claim_")}
	pool := testdb.Pool(t)
	f.pool = pool
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.proxy.URL(t, "application_name="+f.app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	scope := testdb.Unique("go_claim_")
	opts.Scope = func(*http.Request) string { return scope }
	opts.Logger = log.New(io.Discard, "", 0)
	h := func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		f.runs.Add(1)
		if err := testdb.Debit(r.Context(), tx, scope, idempotency.Key(r.Context())); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	f.viaProxy = httptest.NewServer(idempotency.New(conn, opts).HandleTx(h))
	opts.ClaimTimeout = 0 // the default, for the retries
	f.plain = httptest.NewServer(idempotency.New(pool, opts).HandleTx(h))
	t.Cleanup(f.viaProxy.Close)
	t.Cleanup(f.plain.Close)
	// A first request through the proxy prepares the statements on its connection.
	if r := testdb.Post(t, f.viaProxy.URL, testdb.Unique("k"), `{}`); r.Status != 201 {
		t.Fatalf("first request: %+v", r)
	}
	return f
}

// A BEGIN that fails after a claimed key's claim (here the connection is cut when the Sync after the claim goes
// out, as when the backend dies there) is seen before the handler runs: 500, the handler never started, and the
// claim, never committed, leaves the key free for the retry. (BEGIN's answers were read only at the handler's
// first statement, after the handler had started.)
func TestFailedBeginStopsTheHandler(t *testing.T) {
	f := newClaimFixture(t, idempotency.Options{})
	f.runs.Store(0)
	key := testdb.Unique("k")
	f.proxy.CutAtSync.Store(true)
	r := testdb.Post(t, f.viaProxy.URL, key, `{}`)
	if r.Status != 500 || f.runs.Load() != 0 {
		t.Fatalf("BEGIN cut off: %d %q, handler runs %d (want 500 and none)", r.Status, r.Body, f.runs.Load())
	}
	// (Polled: the backend ends the claim's transaction when it reads the end of its connection.)
	if r := retryUntilFree(t, f.plain.URL, key); r.Status != 201 || r.Replayed() || f.runs.Load() != 1 {
		t.Fatalf("the retry: %+v, handler runs %d", r, f.runs.Load())
	}
}

// retryUntilFree posts key to url until it is no longer in progress (409), for 15 s at most, and returns the last
// answer.
func retryUntilFree(t *testing.T, url, key string) testdb.Result {
	t.Helper()
	var r testdb.Result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r = testdb.Post(t, url, key, `{}`); r.Status != 409 {
			break
		}
	}
	return r
}

// A client stalled between the claim and its Sync (the server's answer held back on the way), where the server
// arms no timeout, gives the key back after Options.ClaimTimeout: the connection is closed, the claim's
// transaction ends and the retry is claimed. (The exchange had no deadline but the request's context: the key
// stayed in progress as long as the client waited.)
func TestStalledClaimReleasedAfterClaimTimeout(t *testing.T) {
	const timeout = 2 * time.Second // a margin for the first request through the proxy, which prepares the statements
	f := newClaimFixture(t, idempotency.Options{ClaimTimeout: timeout})
	key := testdb.Unique("k")
	f.proxy.Hold.Store(true)
	stalled := make(chan testdb.Result, 1)
	start := time.Now()
	go func() {
		req, _ := http.NewRequest(http.MethodPost, f.viaProxy.URL, nil)
		req.Header.Set("Idempotency-Key", key)
		req.Body = io.NopCloser(strings.NewReader(`{}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			stalled <- testdb.Result{Status: -1, Body: err.Error()}
			return
		}
		_ = resp.Body.Close()
		stalled <- testdb.Result{Status: resp.StatusCode}
	}()
	// The stalled claim holds the key (a duplicate gets 409) until the deadline closes its connection; the retry is
	// claimed after (polled: the backend ends its transaction when it reads the end of the connection).
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var held bool
		// After the claim and its Flush the backend waits for the next message, its state still "active".
		if err := f.pool.QueryRow(context.Background(), `SELECT count(*) = 1 FROM pg_stat_activity
WHERE application_name = $1::text AND state = 'active' AND query LIKE '%idem_claim_request%'`, f.app).Scan(&held); err != nil {
			t.Fatal(err)
		} else if held {
			break
		} else if time.Now().After(deadline) {
			t.Fatal("the stalled claim never took the key")
		}
	}
	r := retryUntilFree(t, f.plain.URL, key)
	if r.Status != 201 || r.Replayed() {
		t.Fatalf("the retry 15 s after the stalled claim: %+v", r)
	}
	if elapsed := time.Since(start); elapsed < timeout {
		t.Fatalf("the key was free after %v, before the claim's deadline", elapsed)
	}
	select {
	case s := <-stalled:
		if s.Status != 500 {
			t.Fatalf("the stalled request: %+v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled request never answered")
	}
}
