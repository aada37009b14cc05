// Command payments is the payment service of clients/CONTRACT.md.
//
// Environment: PORT (listens on 127.0.0.1:$PORT), DATABASE_URL (libpq URI of a database with the idempotency
// extension and the ledger table), PAYMENTS_FAULTS=1 to honour the X-Fault request header, PAYMENTS_FRAMEWORK
// (net/http, the default, chi, echo or gin) for the router that serves POST /payments.
package main

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/payments"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	port := os.Getenv("PORT")
	dsn := os.Getenv("DATABASE_URL")
	if port == "" || dsn == "" {
		log.Fatal("payments: PORT and DATABASE_URL must be set")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	connectCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	pool, err := idempotency.NewPool(connectCtx, dsn) // prepared statements; the simple protocol behind PgBouncer
	cancel()
	if err != nil {
		log.Fatalf("payments: connect: %v", err)
	}
	defer pool.Close()

	var ridesLease time.Duration
	if v := os.Getenv("RIDES_LEASE_SECONDS"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs <= 0 {
			log.Fatalf("payments: RIDES_LEASE_SECONDS=%q is not a positive number", v)
		}
		ridesLease = time.Duration(secs * float64(time.Second))
	}
	handler, err := payments.NewHandler(pool, payments.Config{
		Faults:     os.Getenv("PAYMENTS_FAULTS") == "1",
		Framework:  os.Getenv("PAYMENTS_FRAMEWORK"),
		RidesLease: ridesLease,
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", port))
	if err != nil {
		log.Fatalf("payments: listen: %v", err)
	}
	statements := "prepared statements"
	if pool.Config().ConnConfig.PreferSimpleProtocol {
		statements = "the simple protocol (behind a pooler, or prefer_simple_protocol=true)"
	}
	log.Printf("payments: listening on http://%s; %s", ln.Addr(), statements)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Fatalf("payments: %v", err)
		}
	case <-ctx.Done():
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}
}
