// Command idembench measures what the idempotency middleware costs a transactional handler, in process (no HTTP,
// so the figures are the database round trips): every configuration debits the ledger once per request with the
// same INSERT, the same driver and the same pool, from -workers goroutines for -seconds, in -rounds rounds whose
// order rotates (reversed every other round), and reports the median requests/s of each.
//
//	autocommit   the INSERT alone (1 round trip)
//	bare-tx      BEGIN, the INSERT, COMMIT (3): the baseline of issue 25's target
//	guard        the middleware, pipelined: BEGIN+claim, the INSERT, complete+COMMIT (3)
//	guard-nopipe the middleware with Options.NoPipeline: BEGIN, claim, INSERT, complete, COMMIT (5)
//	sql-*        the same three over database/sql (OpenSQL, pgx stdlib), compared with sql-bare-tx
//
// Usage: idembench -url postgresql://... [-url2 postgresql://... (e.g. through PgBouncer)] [-workers 8]
// The database needs the extension and clients/schema.sql. Rows are written under accounts bench_<hex time>.
package main

import (
	"bytes"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

const insertSQL = `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -100, 'USD', $2::text) RETURNING id`

type config struct {
	name string
	run  func(ctx context.Context, account string, n int64) error
}

func configs(pool *pgxpool.Pool, db *sql.DB) []config {
	respond := func(w http.ResponseWriter, id int64) error {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := fmt.Fprintf(w, `{"payment_id":%d}`, id)
		return err
	}
	guarded := func(noPipeline, useSQL bool) func(ctx context.Context, account string, n int64) error {
		opts := idempotency.Options{
			Scope:      func(r *http.Request) string { return r.Header.Get("X-Account") },
			NoPipeline: noPipeline,
			Logger:     log.New(io.Discard, "", 0),
		}
		var h http.Handler
		if useSQL {
			h = idempotency.NewSQL(db, opts).HandleSQL(func(w http.ResponseWriter, r *http.Request, q idempotency.Querier) error {
				var id int64
				if err := q.QueryRowContext(r.Context(), insertSQL, r.Header.Get("X-Account"), idempotency.Key(r.Context())).Scan(&id); err != nil {
					return err
				}
				return respond(w, id)
			})
		} else {
			h = idempotency.New(pool, opts).HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				var id int64
				if err := tx.QueryRow(r.Context(), insertSQL, r.Header.Get("X-Account"), idempotency.Key(r.Context())).Scan(&id); err != nil {
					return err
				}
				return respond(w, id)
			})
		}
		return func(ctx context.Context, account string, n int64) error {
			req := httptest.NewRequest(http.MethodPost, "/payments", bytes.NewReader([]byte(`{"amount_cents":100,"currency":"USD"}`))).WithContext(ctx)
			req.Header.Set("Idempotency-Key", fmt.Sprintf("%s-%d", account, n))
			req.Header.Set("X-Account", account)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				return fmt.Errorf("status %d: %s", rec.Code, rec.Body.String())
			}
			return nil
		}
	}
	return []config{
		{"autocommit", func(ctx context.Context, account string, n int64) error {
			var id int64
			return pool.QueryRow(ctx, insertSQL, account, "").Scan(&id)
		}},
		{"bare-tx", func(ctx context.Context, account string, n int64) error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			var id int64
			if err := tx.QueryRow(ctx, insertSQL, account, "").Scan(&id); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}},
		{"guard", guarded(false, false)},
		{"guard-nopipe", guarded(true, false)},
		{"sql-bare-tx", func(ctx context.Context, account string, n int64) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			var id int64
			if err := tx.QueryRowContext(ctx, insertSQL, account, "").Scan(&id); err != nil {
				return err
			}
			return tx.Commit()
		}},
		{"sql-guard", guarded(false, true)},
		{"sql-guard-nopipe", guarded(true, true)},
	}
}

// measure runs c from workers goroutines for d and returns requests/s.
func measure(c config, workers int, d time.Duration) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	account := fmt.Sprintf("bench_%x", time.Now().UnixNano()) // a fresh account per measurement
	var done atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				n := done.Add(1)
				if err := c.run(ctx, account, n); err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
						cancel()
					}
					done.Add(-1)
					return
				}
			}
			done.Add(-1) // the request the deadline cut short
		}()
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, fmt.Errorf("%s: %w", c.name, err)
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func main() {
	var urls []string
	flag.Func("url", "database URL (repeat for another path to the same database, e.g. PgBouncer)", func(s string) error {
		urls = append(urls, s)
		return nil
	})
	workers := flag.Int("workers", 8, "concurrent requests, and the pool size")
	seconds := flag.Float64("seconds", 4, "length of one measurement")
	rounds := flag.Int("rounds", 5, "rounds; each configuration once per round")
	flag.Parse()
	if len(urls) == 0 {
		fmt.Fprintln(os.Stderr, "idembench: -url is required")
		os.Exit(2)
	}
	type path struct {
		url     string
		configs []config
		rps     map[string][]float64
	}
	var paths []*path
	for _, u := range urls {
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		pool, err := idempotency.NewPool(context.Background(), fmt.Sprintf("%s%spool_max_conns=%d&pool_min_conns=%d", u, sep, *workers, *workers))
		if err != nil {
			log.Fatalf("idembench: %s: %v", u, err)
		}
		defer pool.Close()
		db, err := idempotency.OpenSQL(u)
		if err != nil {
			log.Fatalf("idembench: %s: %v", u, err)
		}
		db.SetMaxOpenConns(*workers)
		db.SetMaxIdleConns(*workers)
		defer db.Close()
		paths = append(paths, &path{url: u, configs: configs(pool, db), rps: map[string][]float64{}})
	}
	d := time.Duration(*seconds * float64(time.Second))
	for r := 0; r < *rounds; r++ {
		for _, p := range paths {
			order := append([]config(nil), p.configs...)
			k := r % len(order)
			order = append(order[k:], order[:k]...)
			if r%2 == 1 {
				for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
					order[i], order[j] = order[j], order[i]
				}
			}
			for _, c := range order {
				rps, err := measure(c, *workers, d)
				if err != nil {
					log.Fatalf("idembench: %v", err)
				}
				p.rps[c.name] = append(p.rps[c.name], rps)
				fmt.Fprintf(os.Stderr, "round %d %s %s %.0f req/s\n", r+1, hostOf(p.url), c.name, rps)
			}
		}
	}
	fmt.Printf("%d workers, pool of %d, %d rounds of %.0f s each, medians of requests/s\n\n", *workers, *workers, *rounds, *seconds)
	fmt.Println("| path | configuration | median req/s | / bare-tx (same driver) | / autocommit | rounds |")
	fmt.Println("|---|---|---:|---:|---:|---|")
	for _, p := range paths {
		auto := median(p.rps["autocommit"])
		for _, c := range p.configs {
			bare := median(p.rps["bare-tx"])
			if strings.HasPrefix(c.name, "sql-") {
				bare = median(p.rps["sql-bare-tx"])
			}
			m := median(p.rps[c.name])
			var each []string
			for _, x := range p.rps[c.name] {
				each = append(each, fmt.Sprintf("%.0f", x))
			}
			fmt.Printf("| %s | %s | %.0f | %.2f | %.2f | %s |\n", hostOf(p.url), c.name, m, m/bare, m/auto, strings.Join(each, ", "))
		}
	}
}

func hostOf(u string) string {
	if pu, err := url.Parse(u); err == nil && pu.Host != "" {
		return pu.Host
	}
	return u
}
