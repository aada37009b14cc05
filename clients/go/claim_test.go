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
)

// claimFixture: one guard over a single connection through testdb.Proxy (claim first over prepared statements,
// the default), one over a direct pool, both in one fresh scope, with a handler that counts its runs before it
// touches the database (as a handler that calls a provider first would).
type claimFixture struct {
	proxy           *testdb.Proxy
	viaProxy, plain *httptest.Server
	runs            atomic.Int32
}

func newClaimFixture(t *testing.T, opts idempotency.Options) *claimFixture {
	f := &claimFixture{proxy: testdb.NewProxy(t)}
	pool := testdb.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, f.proxy.URL(t))
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
	if r := testdb.Post(t, f.plain.URL, key, `{}`); r.Status != 201 || r.Replayed() || f.runs.Load() != 1 {
		t.Fatalf("the retry: %+v, handler runs %d", r, f.runs.Load())
	}
}

// A client stalled between the claim and its Sync (the server's answer held back on the way), where the server
// arms no timeout, gives the key back after Options.ClaimTimeout: the connection is closed, the claim's
// transaction ends and the retry is claimed. (The exchange had no deadline but the request's context: the key
// stayed in progress as long as the client waited.)
func TestStalledClaimReleasedAfterClaimTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
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
	// The key is released once the deadline closed the connection: a duplicate gets 409 until then, the retry
	// 201 after (polled: the backend ends its transaction when it reads the end of the connection).
	var r testdb.Result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = testdb.Post(t, f.plain.URL, key, `{}`); r.Status != 409 {
			break
		}
	}
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
