package ginidem_test

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
	"example.com/idempotency/ginidem"
	"example.com/idempotency/internal/testdb"
	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v4/pgxpool"
)

func init() { gin.SetMode(gin.TestMode) }

type app struct {
	t       *testing.T
	pool    *pgxpool.Pool
	account string
	runs    atomic.Int32
	srv     *httptest.Server
}

func (a *app) opts() idempotency.Options {
	return idempotency.Options{Scope: func(*http.Request) string { return a.account }, Logger: log.New(io.Discard, "", 0)}
}

// debit is the start of every test handler: the ledger insert in the request's transaction.
func (a *app) debit(c *gin.Context) bool {
	a.runs.Add(1)
	ctx := c.Request.Context()
	tx := idempotency.Tx(ctx)
	if tx == nil {
		_ = c.AbortWithError(http.StatusInternalServerError, errors.New("no transaction"))
		return false
	}
	if err := testdb.Debit(ctx, tx, a.account, idempotency.Key(ctx)); err != nil {
		_ = c.Error(err)
		return false
	}
	return true
}

// newApp serves POST /p: ginidem.Handle around a handler that debits, then does what act says.
func newApp(t *testing.T, act func(c *gin.Context)) *app {
	a := &app{t: t, pool: testdb.Pool(t), account: testdb.Unique("go_gin_")}
	r := gin.New()
	r.POST("/p", ginidem.Handle(idempotency.New(a.pool, a.opts()), func(c *gin.Context) {
		if a.debit(c) {
			act(c)
		}
	}))
	a.srv = httptest.NewServer(r)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *app) post(key string) testdb.Result {
	a.t.Helper()
	return testdb.Post(a.t, a.srv.URL+"/p", key, `{"amount_cents": 100}`)
}

func (a *app) rowsAre(want int) {
	a.t.Helper()
	if n := testdb.LedgerRows(a.t, a.pool, a.account); n != want {
		a.t.Fatalf("%d ledger rows, want %d", n, want)
	}
}

// A handler that debits, then aborts with 502: the 502 is sent, the debit rolled back, the key free.
func TestAbortWith5xxRollsBack(t *testing.T) {
	a := newApp(t, func(c *gin.Context) { c.AbortWithStatus(http.StatusBadGateway) })
	key := testdb.Unique("k")
	if r := a.post(key); r.Status != 502 {
		t.Fatalf("%+v", r)
	}
	a.rowsAre(0)
	if r := a.post(key); r.Status != 502 || r.Replayed() || a.runs.Load() != 2 {
		t.Fatalf("retry %+v runs %d", r, a.runs.Load())
	}
}

// c.Status(422) with no body: gin sends the status only after the chain; the middleware sees the 422 and stores
// it, never a 200.
func TestStatusWithoutBodyIsSeen(t *testing.T) {
	a := newApp(t, func(c *gin.Context) { c.Status(http.StatusUnprocessableEntity) })
	key := testdb.Unique("k")
	first := a.post(key)
	second := a.post(key)
	if first.Status != 422 || second.Status != 422 || !second.Replayed() {
		t.Fatalf("first %+v second %+v", first, second)
	}
	a.rowsAre(1)
}

// An error recorded with c.Error and no response: rolled back and answered 500.
func TestErrorWithoutResponseRollsBack(t *testing.T) {
	a := newApp(t, func(c *gin.Context) { _ = c.Error(errors.New("provider said no")) })
	key := testdb.Unique("k")
	if r := a.post(key); r.Status != 500 || r.Replayed() {
		t.Fatalf("%+v", r)
	}
	a.rowsAre(0)
}

// AbortWithError(409, ...) is a response: stored and replayed.
func TestAbortWith4xxIsStored(t *testing.T) {
	a := newApp(t, func(c *gin.Context) {
		c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "duplicate order"})
	})
	key := testdb.Unique("k")
	first := a.post(key)
	second := a.post(key)
	if first.Status != 409 || second.Status != 409 || !second.Replayed() || second.Body != first.Body {
		t.Fatalf("first %+v second %+v", first, second)
	}
	a.rowsAre(1)
}

// 201 JSON, a 40001 on the first run recorded with c.Error: run again, stored once, replayed byte for byte.
func TestCreatedAfterConflict(t *testing.T) {
	var a *app
	a = newApp(t, func(c *gin.Context) {
		ctx := c.Request.Context()
		if idempotency.Attempt(ctx) == 0 {
			_, err := idempotency.Tx(ctx).Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`)
			_ = c.Error(fmt.Errorf("debit: %w", err))
			return
		}
		c.Header("Location", "/p/1")
		c.JSON(http.StatusCreated, gin.H{"id": 1, "account": a.account})
	})
	key := testdb.Unique("k")
	first := a.post(key)
	second := a.post(key)
	if first.Status != 201 || second.Status != 201 || !second.Replayed() || second.Body != first.Body ||
		second.Header.Get("Location") != "/p/1" {
		t.Fatalf("first %+v second %+v", first, second)
	}
	if a.runs.Load() != 2 {
		t.Fatalf("runs %d", a.runs.Load())
	}
	a.rowsAre(1)
}

// The wrap a gin user wrote before this package: the net/http middleware around c.Next(). The handler writes to
// gin's own writer, past the middleware's recorder, so the middleware sees no status: it must not commit the
// debit with an empty 200 that every retry would then replay.
func TestNaiveWrapCommitsNothingUnseen(t *testing.T) {
	a := &app{t: t, pool: testdb.Pool(t), account: testdb.Unique("go_gin_")}
	mw := idempotency.Middleware(a.pool, a.opts())
	r := gin.New()
	r.POST("/p", func(c *gin.Context) {
		mw(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			c.Request = req
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
	}, func(c *gin.Context) {
		if a.debit(c) {
			c.JSON(http.StatusCreated, gin.H{"ok": true})
		}
	})
	a.srv = httptest.NewServer(r)
	defer a.srv.Close()
	key := testdb.Unique("k")
	a.post(key)
	a.rowsAre(0)
	if second := a.post(key); second.Replayed() {
		t.Fatalf("a response the middleware never saw was stored: %+v", second)
	}
}

func TestUnguardedMethodRunsDirectly(t *testing.T) {
	r := gin.New()
	r.GET("/p", ginidem.Handle(idempotency.New(nil, idempotency.Options{}), func(c *gin.Context) {
		c.String(http.StatusTeapot, "tea")
	}))
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/p", nil))
	if rec.Code != http.StatusTeapot {
		t.Fatalf("%d", rec.Code)
	}
}
