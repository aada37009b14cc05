package echoidem_test

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"example.com/idempotency"
	"example.com/idempotency/echoidem"
	"example.com/idempotency/internal/testdb"
	"github.com/jackc/pgx/v4/pgxpool"
	"github.com/labstack/echo/v4"
)

// app is an echo server whose POST /p debits a fresh account in the request's transaction, then does what act
// says.
type app struct {
	t       *testing.T
	pool    *pgxpool.Pool
	account string
	runs    atomic.Int32
	srv     *httptest.Server
}

func newApp(t *testing.T, wrap func(g *idempotency.Guard, opts idempotency.Options) echo.MiddlewareFunc,
	act func(c echo.Context) error) *app {
	pool := testdb.Pool(t)
	a := &app{t: t, pool: pool, account: testdb.Unique("go_echo_")}
	opts := idempotency.Options{
		Scope:  func(*http.Request) string { return a.account },
		Logger: log.New(io.Discard, "", 0),
	}
	e := echo.New()
	e.HideBanner = true
	e.Logger.SetOutput(io.Discard)
	e.POST("/p", func(c echo.Context) error {
		a.runs.Add(1)
		ctx := c.Request().Context()
		tx := idempotency.Tx(ctx)
		if tx == nil {
			return errors.New("no transaction")
		}
		if err := testdb.Debit(ctx, tx, a.account, idempotency.Key(ctx)); err != nil {
			return err
		}
		return act(c)
	}, wrap(idempotency.New(pool, opts), opts))
	a.srv = httptest.NewServer(e)
	t.Cleanup(a.srv.Close)
	return a
}

func native(g *idempotency.Guard, _ idempotency.Options) echo.MiddlewareFunc {
	return echoidem.Middleware(g)
}

func (a *app) post(key string) testdb.Result {
	a.t.Helper()
	return testdb.Post(a.t, a.srv.URL+"/p", key, `{"amount_cents": 100}`)
}

// rowsAre checks the number of ledger rows of the app's account.
func (a *app) rowsAre(want int) {
	a.t.Helper()
	if n := testdb.LedgerRows(a.t, a.pool, a.account); n != want {
		a.t.Fatalf("%d ledger rows, want %d", n, want)
	}
}

// The case: echo.WrapMiddleware around the net/http middleware, a handler that debits and returns
// echo.NewHTTPError(422). echo renders the error after the wrapped middleware has returned, so the middleware
// never sees a status: it must roll back, not store (and replay) an empty 200 with the debit committed.
func TestWrapMiddlewareNeverCommitsAnUnseenStatus(t *testing.T) {
	wrapped := func(g *idempotency.Guard, _ idempotency.Options) echo.MiddlewareFunc {
		return echo.WrapMiddleware(g.Middleware)
	}
	a := newApp(t, wrapped, func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "insufficient funds")
	})
	key := testdb.Unique("k")
	first := a.post(key)
	if first.Status == http.StatusOK {
		t.Fatalf("the middleware answered the 200 it never saw: %+v", first)
	}
	a.rowsAre(0)
	second := a.post(key)
	if second.Replayed() || a.runs.Load() != 2 {
		t.Fatalf("the retry was not run again (runs %d): %+v", a.runs.Load(), second)
	}
	a.rowsAre(0)
}

// With the adapter the returned HTTPError is rendered by echo's error handler inside the transaction: the 422 the
// client gets is the 422 stored, and the replay is the same bytes.
func TestHTTPErrorIsTheStatusStored(t *testing.T) {
	a := newApp(t, native, func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "insufficient funds")
	})
	key := testdb.Unique("k")
	first := a.post(key)
	if first.Status != 422 || first.Body == "" || first.Replayed() {
		t.Fatalf("first: %+v", first)
	}
	second := a.post(key)
	if second.Status != 422 || !second.Replayed() || second.Body != first.Body ||
		second.Header.Get("Content-Type") != first.Header.Get("Content-Type") {
		t.Fatalf("replay %+v, first %+v", second, first)
	}
	if a.runs.Load() != 1 {
		t.Fatalf("handler runs %d", a.runs.Load())
	}
	a.rowsAre(1)
}

// A custom HTTPErrorHandler is the app's word on the status: a domain error it maps to 409 is stored as 409.
func TestCustomErrorHandler(t *testing.T) {
	errLimit := errors.New("daily limit reached")
	e := echo.New()
	e.HTTPErrorHandler = func(err error, c echo.Context) {
		if errors.Is(err, errLimit) {
			_ = c.JSON(http.StatusConflict, map[string]string{"error": "limit"})
			return
		}
		e.DefaultHTTPErrorHandler(err, c)
	}
	pool := testdb.Pool(t)
	account := testdb.Unique("go_echo_")
	g := idempotency.New(pool, idempotency.Options{Scope: func(*http.Request) string { return account },
		Logger: log.New(io.Discard, "", 0)})
	e.POST("/p", func(c echo.Context) error {
		ctx := c.Request().Context()
		if err := testdb.Debit(ctx, idempotency.Tx(ctx), account, idempotency.Key(ctx)); err != nil {
			return err
		}
		return fmt.Errorf("debit: %w", errLimit)
	}, echoidem.Middleware(g))
	srv := httptest.NewServer(e)
	defer srv.Close()
	key := testdb.Unique("k")
	first := testdb.Post(t, srv.URL+"/p", key, `{}`)
	second := testdb.Post(t, srv.URL+"/p", key, `{}`)
	if first.Status != 409 || second.Status != 409 || !second.Replayed() || second.Body != first.Body {
		t.Fatalf("first %+v second %+v", first, second)
	}
	if n := testdb.LedgerRows(t, pool, account); n != 1 {
		t.Fatalf("%d rows", n)
	}
}

// A 5xx HTTPError is sent as echo renders it and rolled back: the debit is undone, the key free.
func TestHTTPError5xxRollsBack(t *testing.T) {
	a := newApp(t, native, func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusBadGateway, "provider down")
	})
	key := testdb.Unique("k")
	if r := a.post(key); r.Status != 502 || r.Replayed() {
		t.Fatalf("%+v", r)
	}
	a.rowsAre(0)
	if r := a.post(key); r.Status != 502 || r.Replayed() || a.runs.Load() != 2 {
		t.Fatalf("retry: %+v (runs %d)", r, a.runs.Load())
	}
	a.rowsAre(0)
}

// An error returned after the handler wrote its 201 means the handler failed midway: rolled back, 500.
func TestErrorAfterWriteRollsBack(t *testing.T) {
	a := newApp(t, native, func(c echo.Context) error {
		if err := c.JSON(http.StatusCreated, map[string]int{"id": 1}); err != nil {
			return err
		}
		return errors.New("audit log failed")
	})
	key := testdb.Unique("k")
	if r := a.post(key); r.Status != 500 || r.Replayed() {
		t.Fatalf("%+v", r)
	}
	a.rowsAre(0)
}

// The happy path, with a 40001 on the first run: the transaction runs again and the 201 is stored once.
func TestCreatedAndRetriedConflict(t *testing.T) {
	a := newApp(t, native, func(c echo.Context) error {
		ctx := c.Request().Context()
		if idempotency.Attempt(ctx) == 0 {
			_, err := idempotency.Tx(ctx).Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			return fmt.Errorf("debit: %w", err)
		}
		c.Response().Header().Set("Location", "/p/1")
		if err := c.JSON(http.StatusCreated, map[string]any{"id": 1, "note": "ok"}); err != nil {
			return err
		}
		c.Response().Flush() // buffered until the commit: a no-op, not a panic
		return nil
	})
	key := testdb.Unique("k")
	first := a.post(key)
	second := a.post(key)
	if first.Status != 201 || second.Status != 201 || !second.Replayed() || second.Body != first.Body ||
		second.Header.Get("Location") != "/p/1" {
		t.Fatalf("first %+v second %+v", first, second)
	}
	if a.runs.Load() != 2 {
		t.Fatalf("runs %d, want 2 (the conflict, then the success)", a.runs.Load())
	}
	a.rowsAre(1)
}

func TestUnguardedMethodPassesThrough(t *testing.T) {
	e := echo.New()
	g := idempotency.New(nil, idempotency.Options{})
	e.GET("/p", func(c echo.Context) error {
		if idempotency.Tx(c.Request().Context()) != nil {
			return errors.New("a GET got a transaction")
		}
		return c.String(http.StatusTeapot, "tea")
	}, echoidem.Middleware(g))
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/p", nil))
	if rec.Code != http.StatusTeapot || rec.Body.String() != "tea" {
		t.Fatalf("%d %q", rec.Code, rec.Body.String())
	}
}
