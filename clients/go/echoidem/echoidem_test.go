package echoidem_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/echoidem"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/labstack/echo/v4"
)

// newApp serves POST /p on e (a new echo when nil): a handler that debits the app's account in the request's
// transaction, then does what act says, behind the middleware wrap makes of the guard.
func newApp(t *testing.T, e *echo.Echo, wrap func(g *idempotency.Guard) echo.MiddlewareFunc, act func(c echo.Context) error) *testdb.App {
	a := testdb.NewApp(t, "go_echo_")
	if e == nil {
		e = echo.New()
	}
	e.HideBanner = true
	e.Logger.SetOutput(io.Discard)
	e.POST("/p", func(c echo.Context) error {
		a.Runs.Add(1)
		ctx := c.Request().Context()
		tx := idempotency.Tx(ctx)
		if tx == nil {
			return errors.New("no transaction")
		}
		if err := testdb.Debit(ctx, tx, a.Account, idempotency.Key(ctx)); err != nil {
			return err
		}
		return act(c)
	}, wrap(idempotency.New(a.Pool, a.Options())))
	a.Serve(e)
	return a
}

func native(g *idempotency.Guard) echo.MiddlewareFunc { return echoidem.Middleware(g) }

// The case: echo.WrapMiddleware around the net/http middleware, a handler that debits and returns
// echo.NewHTTPError(422). echo renders the error after the wrapped middleware has returned, so the middleware
// never sees a status: it must roll back, not store (and replay) an empty 200 with the debit committed.
func TestWrapMiddlewareNeverCommitsAnUnseenStatus(t *testing.T) {
	wrapped := func(g *idempotency.Guard) echo.MiddlewareFunc {
		return echo.WrapMiddleware(g.Middleware)
	}
	a := newApp(t, nil, wrapped, func(c echo.Context) error {
		return echo.NewHTTPError(http.StatusUnprocessableEntity, "insufficient funds")
	})
	key := testdb.Unique("k")
	first := a.Post(key)
	if first.Status == http.StatusOK {
		t.Fatalf("the middleware answered the 200 it never saw: %+v", first)
	}
	a.RowsAre(0)
	second := a.Post(key)
	if second.Replayed() || a.Runs.Load() != 2 {
		t.Fatalf("the retry was not run again (runs %d): %+v", a.Runs.Load(), second)
	}
	a.RowsAre(0)
}

// With the adapter a returned error is rendered by the app's error handler inside the transaction, so the status
// the client gets is the status stored: below 500 stored with the debit and replayed byte for byte; a 5xx, or an
// error returned after the handler wrote its 201 (it failed midway: 500), rolled back, the key free for the retry.
func TestReturnedErrorIsTheStatusStored(t *testing.T) {
	errLimit := errors.New("daily limit reached")
	for _, tc := range []struct {
		name   string
		custom bool // a custom HTTPErrorHandler, the app's word on the status: errLimit is a 409
		status int
		act    func(c echo.Context) error
	}{
		{"HTTPError 422", false, 422, func(c echo.Context) error {
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "insufficient funds")
		}},
		{"a domain error the app's handler maps to 409", true, 409, func(c echo.Context) error {
			return fmt.Errorf("debit: %w", errLimit)
		}},
		{"HTTPError 502", false, 502, func(c echo.Context) error {
			return echo.NewHTTPError(http.StatusBadGateway, "provider down")
		}},
		{"an error after the 201", false, 500, func(c echo.Context) error {
			if err := c.JSON(http.StatusCreated, map[string]int{"id": 1}); err != nil {
				return err
			}
			return errors.New("audit log failed")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := echo.New()
			if tc.custom {
				e.HTTPErrorHandler = func(err error, c echo.Context) {
					if errors.Is(err, errLimit) {
						_ = c.JSON(http.StatusConflict, map[string]string{"error": "limit"})
						return
					}
					e.DefaultHTTPErrorHandler(err, c)
				}
			}
			a := newApp(t, e, native, tc.act)
			key := testdb.Unique("k")
			first, second := a.Post(key), a.Post(key)
			stored := tc.status < 500
			if first.Status != tc.status || first.Body == "" || first.Replayed() || second.Status != tc.status ||
				second.Replayed() != stored || (stored && (second.Body != first.Body ||
				second.Header.Get("Content-Type") != first.Header.Get("Content-Type"))) ||
				a.Runs.Load() != map[bool]int32{true: 1, false: 2}[stored] {
				t.Fatalf("first %+v, second %+v, handler runs %d", first, second, a.Runs.Load())
			}
			a.RowsAre(map[bool]int{true: 1}[stored])
		})
	}
}

// The happy path, with a 40001 on the first run: the transaction runs again and the 201 is stored once.
func TestCreatedAndRetriedConflict(t *testing.T) {
	a := newApp(t, nil, native, func(c echo.Context) error {
		ctx := c.Request().Context()
		if idempotency.Attempt(ctx) == 0 {
			_, err := idempotency.Tx(ctx).Exec(ctx, testdb.SerializationFailure)
			return fmt.Errorf("debit: %w", err)
		}
		c.Response().Header().Set("Location", "/p/1")
		if err := c.JSON(http.StatusCreated, map[string]any{"id": 1, "note": "ok"}); err != nil {
			return err
		}
		c.Response().Flush() // buffered until the commit: a no-op, not a panic
		return nil
	})
	a.CreatedOnceAfterConflict()
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

// The fingerprint takes the request line's path as sent, whatever echo's router made of it: /files/a%2Fb and
// /files/a/b are two requests (testdb.RequestLines).
func TestOneRequestLineOneFingerprint(t *testing.T) {
	a := testdb.NewApp(t, "go_echo_")
	e := echo.New()
	e.HideBanner = true
	e.Logger.SetOutput(io.Discard)
	e.POST("/files/*", func(c echo.Context) error {
		return c.String(http.StatusCreated, fmt.Sprintf("run %d", a.Runs.Add(1)))
	}, echoidem.Middleware(idempotency.New(a.Pool, a.Options())))
	a.Serve(e)
	testdb.CheckRequestLines(t, a.Srv.URL)
}
