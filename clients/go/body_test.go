package idempotency_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/echoidem"
	"github.com/idempotency-pg/idempotency/clients/go/ginidem"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgx/v4"
	"github.com/labstack/echo/v4"
)

// limit is the apps' Options.MaxBodyBytes: under net/http's 256 KiB, which the server drains after a handler
// that left a body unread, unless the answer closes the connection.
const limit = 64 << 10

// answerWithin bounds every answer here: each takes milliseconds; a server waiting for body bytes never sent
// waits forever. 10 s is the margin for two busy cores.
const answerWithin = 10 * time.Second

// adapterApps are the small apps of every adapter: POST /p debits the app's account and answers 201.
func adapterApps(t *testing.T) map[string]*testdb.App {
	apps := map[string]*testdb.App{}
	for _, name := range []string{"net/http", "chi", "echo", "gin", "database/sql"} {
		a := testdb.NewApp(t, "go_body_")
		opts := a.Options()
		opts.MaxBodyBytes = limit
		g := idempotency.New(a.Pool, opts)
		debit := func(ctx context.Context) error {
			a.Runs.Add(1)
			return testdb.Debit(ctx, idempotency.Tx(ctx), a.Account, idempotency.Key(ctx))
		}
		created := func(w http.ResponseWriter) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, `{"ok":true}`)
		}
		switch name {
		case "net/http":
			a.Serve(g.HandleTx(func(w http.ResponseWriter, r *http.Request, _ pgx.Tx) error {
				if err := debit(r.Context()); err != nil {
					return err
				}
				created(w)
				return nil
			}))
		case "chi":
			r := chi.NewRouter()
			r.With(g.Middleware).Post("/p", func(w http.ResponseWriter, r *http.Request) {
				if err := debit(r.Context()); err != nil {
					idempotency.Fail(r.Context(), err)
					return
				}
				created(w)
			})
			a.Serve(r)
		case "echo":
			e := echo.New()
			e.POST("/p", func(c echo.Context) error {
				if err := debit(c.Request().Context()); err != nil {
					return err
				}
				created(c.Response())
				return nil
			}, echoidem.Middleware(g))
			a.Serve(e)
		case "gin":
			gin.SetMode(gin.ReleaseMode)
			r := gin.New()
			r.POST("/p", ginidem.Handle(g, func(c *gin.Context) {
				if err := debit(c.Request.Context()); err != nil {
					_ = c.Error(err)
					return
				}
				c.JSON(http.StatusCreated, gin.H{"ok": true})
			}))
			a.Serve(r)
		case "database/sql":
			db, err := idempotency.OpenSQL(os.Getenv(testdb.Env))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			a.Serve(idempotency.NewSQL(db, opts).HandleSQL(func(w http.ResponseWriter, r *http.Request, q idempotency.Querier) error {
				a.Runs.Add(1)
				ctx := r.Context()
				if _, err := q.ExecContext(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1, -100, 'USD', $2)`, a.Account, idempotency.Key(ctx)); err != nil {
					return err
				}
				created(w)
				return nil
			}))
		}
		apps[name] = a
	}
	return apps
}

// rawPost sends POST /p with key and the header lines hdr, then body, then ends its side of the connection (a
// client gone mid-body) when hangUp, and reads the answer.
func rawPost(t *testing.T, a *testdb.App, key, hdr, body string, hangUp bool) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", a.Srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(answerWithin))
	if _, err := fmt.Fprintf(c, "POST /p HTTP/1.1\r\nHost: x\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\n%s\r\n%s",
		key, hdr, body); err != nil {
		t.Fatal(err)
	}
	if hangUp {
		_ = c.(*net.TCPConn).CloseWrite()
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer within %v (the server waits for the rest of the body?): %v", answerWithin, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp
}

// refused sends a request with send(key): it is answered status problem+json, runs nothing and claims nothing;
// the proper retry with the same key is then claimed and executed (not replayed).
func refused(t *testing.T, a *testdb.App, status int, send func(key string) *http.Response) {
	t.Helper()
	key, runs, rows := testdb.Unique("k"), a.Runs.Load(), testdb.LedgerRows(t, a.Pool, a.Account)
	if resp := send(key); resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("answered %d %v, want %d problem+json", resp.StatusCode, resp.Header, status)
	}
	a.RowsAre(rows)
	if r := a.Post(key); r.Status != http.StatusCreated || r.Replayed() || a.Runs.Load() != runs+1 {
		t.Fatalf("the retry: %+v, handler runs %d", r, a.Runs.Load()-runs)
	}
	a.RowsAre(rows + 1)
}

// A client that hangs up after 37 of the 600 bytes its Content-Length announced: the 37 bytes are a whole JSON
// payment, but not the request; it is not executed.
func TestTruncatedBodyIsNotExecuted(t *testing.T) {
	for name, a := range adapterApps(t) {
		t.Run(name, func(t *testing.T) {
			refused(t, a, http.StatusBadRequest, func(key string) *http.Response {
				return rawPost(t, a, key, "Content-Length: 600\r\n", `{"amount_cents":100,"currency":"EUR"}`, true)
			})
		})
	}
}

// A Content-Length over the limit is answered 413 with no byte of the body sent; a chunked body is answered 413
// once it passes the limit, the rest never sent.
func TestOversizedBodyIs413BeforeReading(t *testing.T) {
	chunk := strings.Repeat(" ", limit+1)
	for name, a := range adapterApps(t) {
		t.Run(name, func(t *testing.T) {
			refused(t, a, http.StatusRequestEntityTooLarge, func(key string) *http.Response {
				return rawPost(t, a, key, fmt.Sprintf("Content-Length: %d\r\n", limit+1), "", false)
			})
			refused(t, a, http.StatusRequestEntityTooLarge, func(key string) *http.Response {
				return rawPost(t, a, key, "Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n", len(chunk), chunk), false)
			})
		})
	}
}
