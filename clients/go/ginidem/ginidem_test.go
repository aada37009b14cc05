package ginidem_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/ginidem"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
)

func init() { gin.SetMode(gin.TestMode) }

// debit is the start of every test handler: the ledger insert in the request's transaction.
func debit(a *testdb.App, c *gin.Context) bool {
	a.Runs.Add(1)
	ctx := c.Request.Context()
	tx := idempotency.Tx(ctx)
	if tx == nil {
		_ = c.AbortWithError(http.StatusInternalServerError, errors.New("no transaction"))
		return false
	}
	if err := testdb.Debit(ctx, tx, a.Account, idempotency.Key(ctx)); err != nil {
		_ = c.Error(err)
		return false
	}
	return true
}

// newApp serves POST /p: ginidem.Handle around a handler that debits, then does what act says.
func newApp(t *testing.T, act func(c *gin.Context)) *testdb.App {
	a := testdb.NewApp(t, "go_gin_")
	r := gin.New()
	r.POST("/p", ginidem.Handle(idempotency.New(a.Pool, a.Options()), func(c *gin.Context) {
		if debit(a, c) {
			act(c)
		}
	}))
	a.Serve(r)
	return a
}

// What a handler answers after its debit is what is sent: below 500 stored with the debit and replayed byte for
// byte; a 5xx, or an error recorded with c.Error and no response (500), rolled back, the key free for the retry.
func TestAnswerIsStoredOrRolledBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		act    func(c *gin.Context)
	}{
		{"AbortWithStatus 502", 502, func(c *gin.Context) { c.AbortWithStatus(http.StatusBadGateway) }},
		// gin sends a status set with c.Status and no body only after the chain: the middleware sees the 422 and
		// stores it, never a 200.
		{"Status 422 without a body", 422, func(c *gin.Context) { c.Status(http.StatusUnprocessableEntity) }},
		{"an error and no response", 500, func(c *gin.Context) { _ = c.Error(errors.New("provider said no")) }},
		{"AbortWithStatusJSON 409", 409, func(c *gin.Context) {
			c.AbortWithStatusJSON(http.StatusConflict, gin.H{"error": "duplicate order"})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newApp(t, tc.act)
			key := testdb.Unique("k")
			first, second := a.Post(key), a.Post(key)
			stored := tc.status < 500
			if first.Status != tc.status || first.Replayed() || second.Status != tc.status || second.Replayed() != stored ||
				(stored && second.Body != first.Body) || a.Runs.Load() != map[bool]int32{true: 1, false: 2}[stored] {
				t.Fatalf("first %+v, second %+v, handler runs %d", first, second, a.Runs.Load())
			}
			a.RowsAre(map[bool]int{true: 1}[stored])
		})
	}
}

// 201 JSON, a 40001 on the first run recorded with c.Error: run again, stored once, replayed byte for byte.
func TestCreatedAfterConflict(t *testing.T) {
	var a *testdb.App
	a = newApp(t, func(c *gin.Context) {
		ctx := c.Request.Context()
		if idempotency.Attempt(ctx) == 0 {
			_, err := idempotency.Tx(ctx).Exec(ctx, testdb.SerializationFailure)
			_ = c.Error(fmt.Errorf("debit: %w", err))
			return
		}
		c.Header("Location", "/p/1")
		c.JSON(http.StatusCreated, gin.H{"id": 1, "account": a.Account})
	})
	a.CreatedOnceAfterConflict()
}

// The wrap a gin user wrote before this package: the net/http middleware around c.Next(). The handler writes to
// gin's own writer, past the middleware's recorder, so the middleware sees no status: it must not commit the
// debit with an empty 200 that every retry would then replay.
func TestNaiveWrapCommitsNothingUnseen(t *testing.T) {
	a := testdb.NewApp(t, "go_gin_")
	mw := idempotency.Middleware(a.Pool, a.Options())
	r := gin.New()
	r.POST("/p", func(c *gin.Context) {
		mw(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			c.Request = req
			c.Next()
		})).ServeHTTP(c.Writer, c.Request)
	}, func(c *gin.Context) {
		if debit(a, c) {
			c.JSON(http.StatusCreated, gin.H{"ok": true})
		}
	})
	a.Serve(r)
	key := testdb.Unique("k")
	a.Post(key)
	a.RowsAre(0)
	if second := a.Post(key); second.Replayed() {
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

// The fingerprint takes the request line's path as sent, whatever gin's router made of it: /files/a%2Fb and
// /files/a/b are two requests (testdb.RequestLines).
func TestOneRequestLineOneFingerprint(t *testing.T) {
	a := testdb.NewApp(t, "go_gin_")
	r := gin.New()
	r.POST("/files/*name", ginidem.Handle(idempotency.New(a.Pool, a.Options()), func(c *gin.Context) {
		c.String(http.StatusCreated, "run %d", a.Runs.Add(1))
	}))
	a.Serve(r)
	testdb.CheckRequestLines(t, a.Srv.URL)
}
