// Package echoidem applies the idempotency protocol to echo routes.
//
// echo.WrapMiddleware(idempotency.Middleware(...)) is not enough: an echo handler answers an error by returning
// it (echo.NewHTTPError(422), a database error), and echo renders that error with its HTTPErrorHandler only after
// every middleware has returned, so a wrapped net/http middleware sees no response at all. This adapter runs the
// handler inside the request's transaction with the response writer swapped for the middleware's recorder, and
// renders a returned error with the app's own HTTPErrorHandler into that recorder, still inside the transaction.
// What is committed is exactly the status and body that are then sent: a 4xx is stored; a 5xx, a panic, an error the
// error handler renders as nothing, or an error returned after the handler wrote its response roll back.
package echoidem

import (
	"net/http"
	"strconv"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/jackc/pgx/v4"
	"github.com/labstack/echo/v4"
)

// Middleware returns echo middleware applying g to the routes it wraps (use it per route or per group: it claims
// every request whose method g guards). The handler finds the transaction with
// idempotency.Tx(c.Request().Context()); a 40001/40P01 error it returns runs the whole transaction again.
func Middleware(g *idempotency.Guard) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !g.Guards(c.Request().Method) {
				return next(c)
			}
			res := c.Response()
			orig := res.Writer
			origReq := c.Request()
			g.HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				// Each attempt starts from a fresh response: the writer is the middleware's recorder.
				res.Writer, res.Status, res.Size, res.Committed = w, 0, 0, false
				c.SetRequest(r)
				return run(c, next)
			}).ServeHTTP(&final{ResponseWriter: orig, res: res}, origReq)
			res.Writer = orig
			c.SetRequest(origReq)
			return nil
		}
	}
}

// run calls the handler and renders the error it returns into the recorder, as echo would after the middleware.
func run(c echo.Context, next echo.HandlerFunc) error {
	err := next(c)
	if err == nil {
		return nil
	}
	if idempotency.IsRetryable(err) || c.Response().Committed {
		// A conflict is run again; an error after the response was written means the handler failed midway:
		// roll back rather than commit a response its own code disowned.
		return err
	}
	// echo.NewHTTPError(422), or any error the app's error handler maps to a status: rendered here, so the
	// status sent is the status stored (a 5xx it renders is sent and rolled back).
	c.Echo().HTTPErrorHandler(err, c)
	if !c.Response().Committed {
		return err // the error handler wrote nothing: nothing was seen, nothing is committed
	}
	return nil
}

// final is the writer of the answer the middleware finally sends: it keeps echo's Response (Status, Size,
// Committed) true to what went out, for the logging middleware around this one.
type final struct {
	http.ResponseWriter
	res *echo.Response
}

func (f *final) WriteHeader(status int) {
	f.res.Status, f.res.Committed = status, true
	if n, err := strconv.ParseInt(f.Header().Get("Content-Length"), 10, 64); err == nil {
		f.res.Size = n
	}
	f.ResponseWriter.WriteHeader(status)
}
