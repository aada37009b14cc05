package payments

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"example.com/idempotency/internal/testdb"
	"github.com/jackc/pgx/v4/pgxpool"
)

func startRides(t *testing.T, leaseLen time.Duration) (*pgxpool.Pool, client) {
	pool := testdb.Pool(t)
	srv := httptest.NewServer(mustHandler(t, pool, Config{Faults: true, RidesLease: leaseLen, Logger: log.New(io.Discard, "", 0)}))
	t.Cleanup(srv.Close)
	return pool, client{t: t, url: srv.URL}
}

type rideCounts struct{ charges, rides, receipts int }

func countRides(t *testing.T, pool *pgxpool.Pool, account string) rideCounts {
	t.Helper()
	var c rideCounts
	err := pool.QueryRow(context.Background(), `SELECT
  (SELECT count(*) FROM provider_charges WHERE account = $1::text),
  (SELECT count(*) FROM rides WHERE account = $1::text),
  (SELECT count(*) FROM receipts WHERE account = $1::text)`, account).Scan(&c.charges, &c.rides, &c.receipts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const rideBody = `{"amount_cents": 2500, "currency": "USD"}`

func TestRideStory(t *testing.T) {
	pool, c := startRides(t, 2*time.Second)
	account := testdb.Unique("ride_")
	auth := "Bearer " + account
	key := testdb.Unique("ride-")
	first := c.post("/rides", auth, ptr(key), rideBody, nil)
	second := c.post("/rides", auth, ptr(key), rideBody, nil)
	if first.Status != 201 || second.Status != 201 || second.Header.Get("Idempotent-Replayed") != "true" ||
		second.Body != first.Body || second.Header.Get("Location") != first.Header.Get("Location") {
		t.Fatalf("first %+v replay %+v", first, second)
	}
	var ride struct {
		RideID   int64  `json:"ride_id"`
		ChargeID string `json:"charge_id"`
	}
	if err := json.Unmarshal([]byte(first.Body), &ride); err != nil || ride.ChargeID == "" {
		t.Fatalf("%q: %v", first.Body, err)
	}
	if got := countRides(t, pool, account); got != (rideCounts{1, 1, 1}) {
		t.Fatalf("%+v", got)
	}
	if r := c.post("/rides", auth, ptr(key), `{"amount_cents": 1, "currency": "USD"}`, nil); r.Status != 422 || r.ProblemType() != "idempotency-key-reused" {
		t.Fatalf("mismatch: %+v", r)
	}
	if r := c.post("/rides", auth, ptr(testdb.Unique("ride-")), `{"amount_cents": 0, "currency": "USD"}`, nil); r.Status != 422 || r.ProblemType() != "invalid-payment" {
		t.Fatalf("invalid: %+v", r)
	}
}

// provider-503: nothing stored, the lease released at once; the retry runs and charges once.
func TestRideProvider503(t *testing.T) {
	pool, c := startRides(t, 2*time.Second)
	account := testdb.Unique("ride_")
	key := testdb.Unique("ride-")
	if r := c.post("/rides", "Bearer "+account, ptr(key), rideBody, map[string]string{"X-Fault": "provider-503"}); r.Status != 503 {
		t.Fatalf("%+v", r)
	}
	if r := c.post("/rides", "Bearer "+account, ptr(key), rideBody, nil); r.Status != 201 || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %+v", r)
	}
	if got := countRides(t, pool, account); got != (rideCounts{1, 1, 1}) {
		t.Fatalf("%+v", got)
	}
}

// A holder that died after its checkpoint: the retry takes the lease over once it runs out and resumes at the
// receipt, with the charge and ride the dead holder recorded.
func TestRideResumesAtTheRecoveryPoint(t *testing.T) {
	pool, c := startRides(t, 2*time.Second)
	account := testdb.Unique("ride_")
	key := testdb.Unique("ride-")
	ctx := context.Background()
	var token string
	err := pool.QueryRow(ctx, `SELECT lease_token::text FROM idem_lease($1::text,
  idem_hash(jsonb_build_object('method', 'POST', 'path', '/rides', 'body', $2::jsonb)), '1 second', NULL, $3::text)`,
		key, rideBody, account).Scan(&token)
	if err != nil {
		t.Fatal(err)
	}
	var chargeID string
	var rideID int64
	if err := pool.QueryRow(ctx, `INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency)
VALUES ($1::text, $2::text, 2500, 'USD') RETURNING charge_id`, account, key).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id)
VALUES ($1::text, $2::text, 2500, 'USD', $3::text) RETURNING id`, account, key, chargeID).Scan(&rideID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT idem_checkpoint($1::text, $2::uuid, 'charge_created',
  jsonb_build_object('ride_id', $3::bigint, 'charge_id', $4::text), $5::text)`, key, token, rideID, chargeID, account); err != nil {
		t.Fatal(err)
	}
	if r := c.post("/rides", "Bearer "+account, ptr(key), rideBody, nil); r.Status != 409 {
		t.Fatalf("while the dead holder's lease runs: %+v", r)
	}
	time.Sleep(1500 * time.Millisecond)
	r := c.post("/rides", "Bearer "+account, ptr(key), rideBody, nil)
	var ride struct {
		RideID   int64  `json:"ride_id"`
		ChargeID string `json:"charge_id"`
	}
	if r.Status != 201 || json.Unmarshal([]byte(r.Body), &ride) != nil || ride.ChargeID != chargeID || ride.RideID != rideID {
		t.Fatalf("resumed: %+v, want charge %s ride %d", r, chargeID, rideID)
	}
	if got := countRides(t, pool, account); got != (rideCounts{1, 1, 1}) {
		t.Fatalf("%+v", got)
	}
}

// A stalled holder (heartbeat stopped past its lease): a retry takes over and completes; the stalled holder gets
// 55000 at its checkpoint, answers 409 and writes nothing more.
func TestRideStalledHolderIsFenced(t *testing.T) {
	pool, c := startRides(t, time.Second)
	account := testdb.Unique("ride_")
	key := testdb.Unique("ride-")
	var wg sync.WaitGroup
	var stalled result
	wg.Add(1)
	go func() {
		defer wg.Done()
		stalled = c.post("/rides", "Bearer "+account, ptr(key), rideBody, map[string]string{"X-Fault": "stall=3000"})
	}()
	time.Sleep(1800 * time.Millisecond) // past the 1-s lease the stalled holder no longer extends
	taker := c.post("/rides", "Bearer "+account, ptr(key), rideBody, nil)
	wg.Wait()
	if taker.Status != 201 || taker.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("takeover: %+v", taker)
	}
	if stalled.Status != 409 || stalled.Header.Get("Retry-After") != "1" {
		t.Fatalf("stalled holder: %+v", stalled)
	}
	if got := countRides(t, pool, account); got != (rideCounts{1, 1, 1}) {
		t.Fatalf("%+v", got)
	}
	if r := c.post("/rides", "Bearer "+account, ptr(key), rideBody, nil); r.Status != 201 || r.Body != taker.Body {
		t.Fatalf("replay: %+v", r)
	}
}
