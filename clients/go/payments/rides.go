package payments

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/lease"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// ridesHandler is POST /rides of CONTRACT.md "lease-rides" (rocket rides): a charge at a simulated provider, then
// a receipt from a simulated mailer, each an outside call made with no transaction open, run with lease.Runner;
// the 201 is stored as the bytes sent (idem_lease_complete_request) and replayed as they are.
func (s *service) ridesHandler(pool *pgxpool.Pool, guard *idempotency.Guard) http.Handler {
	runner := &lease.Runner{Pool: pool, Lease: s.cfg.RidesLease, Logger: s.cfg.Logger}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, refused := guard.ReadKey(r)
		var body []byte
		if refused == nil {
			body, refused = guard.ReadBody(r)
		}
		var amount int64
		var currency string
		if refused == nil { // a form, multipart or JSON payment (CONTRACT.md "any-body"), read from the bytes read
			hr := r.Clone(r.Context())
			hr.Body = io.NopCloser(bytes.NewReader(body))
			amount, currency, refused = readPayment(hr) // not executed: no lease taken, nothing stored
		}
		if refused != nil {
			refused.Write(w)
			return
		}
		account := Account(r.Context())
		fault := ""
		if s.cfg.Faults {
			fault = r.Header.Get("X-Fault")
		}
		steps := []lease.Step{
			{Name: "charge_created", Do: func(ctx context.Context, run *lease.Run) error {
				if fault == "provider-503" {
					return run.Finish(ctx, func(pgx.Tx) (*idempotency.Response, error) {
						return problem(http.StatusServiceUnavailable, "provider-unavailable", "Service Unavailable",
							"the payment provider is unavailable"), nil
					})
				}
				// The provider call: idempotent on (account, key), as a real provider is on its Idempotency-Key.
				var chargeID string
				if err := pool.QueryRow(ctx, `INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency)
VALUES ($1::text, $2::text, $3::bigint, $4::text)
ON CONFLICT (account, idempotency_key) DO UPDATE SET amount_cents = EXCLUDED.amount_cents RETURNING charge_id`,
					account, key, amount, currency).Scan(&chargeID); err != nil {
					return fmt.Errorf("provider: %w", err)
				}
				if fault == "crash-after-charge" {
					os.Exit(70)
				}
				if ms, ok := stallOf(fault); ok {
					run.PauseHeartbeat() // a stalled holder: its lease runs out and a retry takes over
					time.Sleep(time.Duration(ms) * time.Millisecond)
				}
				err := run.Tx(ctx, func(tx pgx.Tx) error {
					var rideID int64
					if err := tx.QueryRow(ctx, `INSERT INTO rides (account, idempotency_key, amount_cents, currency, charge_id, fencing_number)
VALUES ($1::text, $2::text, $3::bigint, $4::text, $5::text, $6::bigint) RETURNING id`,
						account, key, amount, currency, chargeID, run.Fencing).Scan(&rideID); err != nil {
						return err
					}
					run.State["ride_id"], run.State["charge_id"] = rideID, chargeID
					return nil
				})
				if err == nil && fault == "crash-after-checkpoint" {
					os.Exit(70)
				}
				return err
			}},
			{Name: "receipt_sent", Do: func(ctx context.Context, run *lease.Run) error {
				rideID, err := strconv.ParseInt(fmt.Sprint(run.State["ride_id"]), 10, 64)
				if err != nil {
					return fmt.Errorf("recovery state %v: %w", run.State, err)
				}
				chargeID := fmt.Sprint(run.State["charge_id"])
				// The mailer: one receipt per (account, key), however often it is asked.
				if _, err := pool.Exec(ctx, `INSERT INTO receipts (account, idempotency_key, ride_id)
VALUES ($1::text, $2::text, $3::bigint) ON CONFLICT DO NOTHING`, account, key, rideID); err != nil {
					return fmt.Errorf("mailer: %w", err)
				}
				return run.Finish(ctx, func(tx pgx.Tx) (*idempotency.Response, error) {
					if _, err := tx.Exec(ctx, `UPDATE rides SET receipt_sent = true WHERE id = $1::bigint`, rideID); err != nil {
						return nil, err
					}
					b := fmt.Sprintf(`{"ride_id": %d, "account": %q, "amount_cents": %d, "currency": %q, "charge_id": %q}`,
						rideID, account, amount, currency, chargeID)
					return &idempotency.Response{Status: http.StatusCreated, Body: []byte(b), Header: http.Header{
						"Content-Type": {"application/json"}, "Location": {"/rides/" + strconv.FormatInt(rideID, 10)}}}, nil
				})
			}},
		}
		runner.Run(r.Context(), lease.Request{Key: key, Scope: account, Method: r.Method, Path: "/rides",
			ContentType: idempotency.RequestContentType(r), Body: body, HTTP: r}, steps).Write(w)
	})
}

func stallOf(fault string) (int, bool) {
	var ms int
	if _, err := fmt.Sscanf(fault, "stall=%d", &ms); err != nil || ms <= 0 {
		return 0, false
	}
	return ms, true
}
