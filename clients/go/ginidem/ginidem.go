// Package ginidem applies the idempotency protocol to gin handlers.
//
// A gin handler answers through gin's own writer (c.JSON, c.Status, c.AbortWithStatus) and reports failures with
// c.Error / c.AbortWithError; gin writes a status set with c.Status only after the whole chain has run. Handle
// runs the handler inside the request's transaction with c.Writer swapped for a gin.ResponseWriter over the
// middleware's recorder, so the middleware sees the status gin would send, and commits exactly that: a 4xx is
// stored; a 5xx, a panic, an error recorded with c.Error and no response, or no response at all roll back. An
// error with a status and no body (c.AbortWithError(422, err)) is answered problem+json, as net/http's
// idempotency.HTTPError and echo's HTTPError are.
package ginidem

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/jackc/pgx/v4"
)

// Handle wraps a route's handler: r.POST("/payments", auth, ginidem.Handle(guard, createPayment)). It wraps the
// handler rather than being chain middleware because a 40001/40P01 runs the whole transaction, handler included,
// again, and gin's chain cannot be run twice. The handler finds the transaction with
// idempotency.Tx(c.Request.Context()). Requests whose method the guard does not guard run h directly.
func Handle(g *idempotency.Guard, h gin.HandlerFunc) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !g.Guards(c.Request.Method) {
			h(c)
			return
		}
		orig := c.Writer
		origReq := c.Request
		g.HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			c.Request = r
			c.Errors = c.Errors[:0]
			rw := &writer{rec: w, orig: orig}
			c.Writer = rw
			h(c)
			for _, e := range c.Errors {
				if idempotency.IsRetryable(e.Err) {
					return e.Err // the whole transaction again
				}
			}
			if last := c.Errors.Last(); last != nil && rw.size == 0 { // an error, no body
				if !rw.touched {
					return last.Err // a failure and no response: rolled back, 500
				}
				if rw.status >= 400 {
					// AbortWithError(422, err): the error's status as problem+json in place of the bare status gin
					// sends, as the other frameworks' errors are answered; the message only of a public error.
					detail := ""
					if last.IsType(gin.ErrorTypePublic) {
						detail = last.Error()
					}
					return &idempotency.HTTPError{Status: rw.status, Detail: detail, Err: last.Err}
				}
			}
			rw.WriteHeaderNow() // a status set with c.Status and no body, as gin sends it after the chain
			return nil
		}).ServeHTTP(orig, origReq)
		c.Writer = orig
		c.Request = origReq
		c.Abort() // the response is sent; nothing after this handler may write
	}
}

// writer is gin's ResponseWriter over the recorder: WriteHeader only sets the status (as gin's does), the first
// Write or WriteHeaderNow sends it to the recorder.
type writer struct {
	rec     http.ResponseWriter
	orig    gin.ResponseWriter
	status  int
	size    int
	wrote   bool
	touched bool // WriteHeader was called
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Header() http.Header { return w.rec.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.wrote {
		w.status, w.touched = code, true
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.wrote && w.touched {
		w.wrote = true
		w.rec.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	if !w.touched {
		w.status, w.touched = http.StatusOK, true
	}
	w.WriteHeaderNow()
	n, err := w.rec.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *writer) Status() int {
	if !w.touched {
		return http.StatusOK // gin's default
	}
	return w.status
}

func (w *writer) Size() int {
	if !w.wrote {
		return -1 // gin's noWritten
	}
	return w.size
}

func (w *writer) Written() bool { return w.wrote }

// The response is buffered until the transaction commits: flushing does nothing, hijacking is refused.
func (w *writer) Flush() {}

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("ginidem: a guarded response is buffered until it is stored; it cannot be hijacked")
}

func (w *writer) CloseNotify() <-chan bool { return w.orig.CloseNotify() }

func (w *writer) Pusher() http.Pusher { return nil }

var _ io.StringWriter = (*writer)(nil)
