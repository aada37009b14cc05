// Package lease runs a request in the extension's lease mode (1.1): for handlers that call something outside the
// database (a payment provider, a mailer) and so cannot do all their work in one transaction.
//
// Runner.Run leases the key (idem_lease, committed at once), then runs the steps after the recovery point the key
// has reached. While a step runs, a heartbeat extends the lease every third of its length. Each step does its
// outside call with no transaction open, then its local writes in Step.Tx, where the runner records the step's
// recovery point (idem_checkpoint) in the same transaction. The last step answers in Run.Finish, which stores the
// response as the bytes sent (idem_lease_complete_request) in the transaction of its last writes; a replay answers
// those bytes with their content type. A holder that lost its lease (SQLSTATE 55000 from any holder call: the lease
// ran out and another request took it over) stops at once, writes nothing more, and the client gets 409. Any other
// failure releases the lease (the recovery point is kept) and answers 500; the retry resumes after the last
// recorded step.
//
// Each step gets the fencing number of the lease (idem_lease's fencing_number), a number that strictly increases
// across takeovers of a key: pass it to systems that can refuse a stale holder.
package lease

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Step is one step of a leased request. Name is the recovery point recorded when it is done (the first step runs
// when the key has none). Do runs it: outside calls first, then the local writes in r.Tx, which records Name and
// r.State with them. A step that never calls r.Tx is recorded in a transaction of its own when it returns.
type Step struct {
	Name string
	Do   func(ctx context.Context, r *Run) error
}

// Runner runs leased requests on a pool (ParsePoolConfig's simple protocol works through PgBouncer).
type Runner struct {
	Pool *pgxpool.Pool
	// Lease is the lease length; 0 means 30 s. The heartbeat extends it every Lease/3.
	Lease time.Duration
	// TTL of the stored response; 0 means the extension's default.
	TTL time.Duration
	// ProblemBase prefixes problem types; "" means idempotency.DefaultProblemBase.
	ProblemBase string
	// Logger; nil means log.Default().
	Logger *log.Logger
	// RenderProblem writes the answers the runner writes itself (409 in progress or lease lost, 410 expired, 422
	// mismatch, 500) in the API's shape, as idempotency.Options.RenderProblem; nil means problem+json.
	RenderProblem idempotency.RenderProblemFunc
	// StoreLess drops members from the stored response (Redact, JSON Pointers) or stores no body (OmitBody), as
	// idempotency.Options.Redact and OmitBody do (CONTRACT.md "store-less"): Finish stores the response without them.
	StoreLess idempotency.StoreLess
}

// Request identifies the leased request: its key, its scope (the authenticated tenant) and its fingerprint,
// computed in SQL from method, path, content type and body (idem_fingerprint of 1.3: a JSON media type, or none,
// canonically, the value 1.2's idem_hash composition gives; any other type as bytes).
//
// Path is the request line's path as sent, undecoded (idempotency.RequestTarget), or a fixed route such as "/rides".
// ContentType is the request's Content-Type (idempotency.RequestContentType: nil when it has none). HTTP, when set,
// is handed to Runner.RenderProblem.
type Request struct {
	Key, Scope, Method, Path string
	ContentType              any
	Body                     []byte
	HTTP                     *http.Request
}

// ErrLeaseLost: a holder call got SQLSTATE 55000, the lease is someone else's now.
var ErrLeaseLost = errors.New("lease: the lease was lost (taken over after it ran out)")

// Run is the state of one leased request, handed to each step.
type Run struct {
	Key, Scope string
	// Fencing is the lease's fencing number.
	Fencing *int64
	// Point is the recovery point reached before the current step ("" for none).
	Point string
	// State is the recovery state: what earlier steps recorded (restored on a takeover); a step adds to it.
	State map[string]any

	runner   *Runner
	leaseLen time.Duration
	token    string
	step     string
	recorded bool
	hb       *heartbeat
	response *idempotency.Response
	// the claim's headers (the key's expiry, CONTRACT.md "key-lifetime"), added to the stored answer once stored
	answerHeaders http.Header
}

// PauseHeartbeat stops extending the lease until the step ends (to simulate a stalled holder in tests).
func (r *Run) PauseHeartbeat() { r.hb.pause() }

// Tx runs fn in a transaction and, in the same transaction, records the current step's recovery point with
// r.State (idem_checkpoint), so the step's local writes and its checkpoint commit together or not at all.
func (r *Run) Tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return r.inTx(ctx, func(tx pgx.Tx) error {
		if err := fn(tx); err != nil {
			return err
		}
		state, err := json.Marshal(r.State)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT idem_checkpoint($1::text, $2::uuid, $3::text, $4::jsonb, $5::text)`,
			r.Key, r.token, r.step, string(state), r.Scope)
		if err == nil {
			r.recorded = true
		}
		return err
	})
}

// Finish runs fn's local writes and stores the response it returns, as the bytes sent with their content type
// (idem_lease_complete_request), in one transaction. A 5xx is not stored, and neither are fn's writes: the
// transaction rolls back, the lease is released with the recovery point kept, and the 5xx is answered; the retry
// runs Finish again (as the transactional middleware rolls a 5xx's writes back, so a retry does not write twice).
func (r *Run) Finish(ctx context.Context, fn func(tx pgx.Tx) (*idempotency.Response, error)) error {
	var failed *idempotency.Response
	err := r.inTx(ctx, func(tx pgx.Tx) error {
		resp, err := fn(tx)
		if err != nil {
			return err
		}
		if resp.Status >= 500 && resp.Status <= 599 {
			failed = resp
			return errServerError // rolls fn's writes back
		}
		// The bytes sent are the bytes stored, as the middleware stores them: every replay is the first answer
		// (less what Runner.StoreLess drops, which never reaches the row).
		contentType, headers, body := r.runner.StoreLess.Stored(resp, nil)
		if _, err := tx.Exec(ctx, `SELECT idem_lease_complete_request($1::text, $2::text, $3::uuid, $4::int, $5::text, $6::jsonb, $7::bytea)`,
			r.Key, r.Scope, r.token, resp.Status, contentType, headers, body); err != nil {
			return err
		}
		// The key's expiry goes on the answer, never into the row: a replay gets it from the server.
		idempotency.AddHeaders(resp.Header, r.answerHeaders)
		r.response, r.recorded = resp, true
		return nil
	})
	if failed == nil || !errors.Is(err, errServerError) {
		return err
	}
	if err := r.runner.release(r); err != nil {
		return err
	}
	r.response, r.recorded = failed, true
	return nil
}

// errServerError rolls back the transaction of a Finish whose response is a 5xx.
var errServerError = errors.New("lease: the response is a 5xx")

func (r *Run) inTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if r.hb.lost() {
		return ErrLeaseLost
	}
	return asLost(r.runner.Pool.BeginFunc(ctx, func(tx pgx.Tx) error {
		// A holder call first: it raises 55000 when the lease is someone else's now, before this holder writes
		// anything (its writes could otherwise collide with the new holder's and fail another way), and it
		// extends the lease for the transaction's length.
		if err := r.extend(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	}))
}

// extend extends the lease by its length (idem_lease_extend) on q, a transaction or the pool.
func (r *Run) extend(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}) error {
	_, err := q.Exec(ctx, `SELECT idem_lease_extend($1::text, $2::uuid, $3::interval, $4::text)`,
		r.Key, r.token, micros(r.leaseLen), r.Scope)
	return err
}

func asLost(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "55000" {
		return fmt.Errorf("%w: %s", ErrLeaseLost, pg.Message)
	}
	return err
}

// Run leases req's key and runs the steps after its recovery point, the last of which calls r.Finish. It returns
// the response to send: the stored one for a replay (with Idempotent-Replayed), a problem for a mismatch (422), a
// key in flight or a lost lease (409, Retry-After: 1), a failure (500, the lease released).
func (rn *Runner) Run(ctx context.Context, req Request, steps []Step) *idempotency.Response {
	logger := rn.Logger
	if logger == nil {
		logger = log.Default()
	}
	leaseLen := rn.Lease
	if leaseLen <= 0 {
		leaseLen = 30 * time.Second
	}
	problem := func(status int, slug, title, detail string, h http.Header) *idempotency.Response {
		return idempotency.RenderProblem(rn.RenderProblem, rn.ProblemBase, req.HTTP,
			idempotency.ProblemDetails{Status: status, Type: slug, Title: title, Detail: detail, Header: h})
	}
	r, early, err := rn.lease(ctx, req, leaseLen)
	if err != nil {
		logger.Printf("lease: %v", err)
		return problem(http.StatusInternalServerError, "internal-error", "Internal Server Error",
			"the lease could not be taken", http.Header{})
	}
	if early != nil {
		return early
	}
	r.leaseLen = leaseLen
	r.hb = startHeartbeat(rn, r, leaseLen, logger)
	err = rn.steps(ctx, r, steps)
	r.hb.stop()
	// After Finish the lease is over (completed, or released on a 5xx), so the heartbeat's extend may get 55000
	// then: that is not a lost lease, and the answer stands.
	if err == nil && r.response == nil && r.hb.lost() {
		err = ErrLeaseLost
	}
	switch {
	case err == nil && r.response != nil:
		return r.response
	case errors.Is(err, ErrLeaseLost):
		return problem(http.StatusConflict, "idempotency-key-in-progress", "Request in progress",
			"this request's lease was taken over by a retry; retry later", http.Header{"Retry-After": {"1"}})
	case err == nil:
		err = errors.New("the last step did not call Finish")
	}
	logger.Printf("lease: key %q: %v (lease released, recovery point kept)", r.Key, err)
	if rerr := rn.release(r); rerr != nil {
		logger.Printf("lease: release %q: %v", r.Key, rerr)
	}
	return problem(http.StatusInternalServerError, "internal-error", "Internal Server Error",
		"the request failed; retry it with the same key to resume", http.Header{})
}

func (rn *Runner) steps(ctx context.Context, r *Run, steps []Step) error {
	start := 0
	if r.Point != "" {
		start = -1
		for i, s := range steps {
			if s.Name == r.Point {
				start = i + 1
			}
		}
		if start < 0 {
			return fmt.Errorf("recovery point %q is no step's name", r.Point)
		}
	}
	for _, s := range steps[start:] {
		r.step, r.recorded = s.Name, false
		if err := s.Do(ctx, r); err != nil {
			return asLost(err)
		}
		if r.response != nil { // Finished: the lease is over, a heartbeat's 55000 after it means nothing
			r.Point = s.Name
			return nil
		}
		if r.hb.lost() {
			return ErrLeaseLost
		}
		if !r.recorded {
			if err := r.Tx(ctx, func(pgx.Tx) error { return nil }); err != nil {
				return err
			}
		}
		r.hb.resume()
		r.Point = s.Name
	}
	return nil
}

// release gives the lease back with its recovery point kept (idem_lease_release), on a context of its own so that
// a cancelled request still releases it.
func (rn *Runner) release(r *Run) error {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := rn.Pool.Exec(rctx, `SELECT idem_lease_release($1::text, $2::uuid, $3::text)`, r.Key, r.token, r.Scope)
	return asLost(err)
}

// lease calls idem_lease (autocommit) and maps the outcomes that end the request at once.
func (rn *Runner) lease(ctx context.Context, req Request, leaseLen time.Duration) (*Run, *idempotency.Response, error) {
	var ttl any
	if rn.TTL > 0 {
		ttl = micros(rn.TTL)
	}
	r := &Run{Key: req.Key, Scope: req.Scope, runner: rn}
	var c idempotency.ClaimRow
	var body *string
	// The stored bytes; for a key stored as jsonb by a 1.0-1.2 client, the body's jsonb text. In base64, a text no
	// setting changes: bytea's own text form depends on bytea_output, and the simple protocol (behind a pooler)
	// reads every column as text.
	err := rn.Pool.QueryRow(ctx, `SELECT l.outcome, l.http_status, l.response_content_type, l.response_headers::text,
  encode(coalesce(l.response_bytes, convert_to(l.response_body::text, 'UTF8')), 'base64'), coalesce(l.lease_token::text, ''),
  coalesce(l.recovery_point, ''), l.recovery_state, l.fencing_number
FROM idem_lease($1::text, idem_fingerprint($2::text, $3::text, NULL, $8::text, $4::bytea),
  $5::interval, $6::interval, $7::text) AS l`,
		req.Key, req.Method, req.Path, req.Body, micros(leaseLen), ttl, req.Scope, req.ContentType).Scan(&c.Outcome, &c.HTTPStatus,
		&c.ContentType, &c.ResponseHeaders, &body, &r.token, &r.Point, &r.State, &r.Fencing)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		b, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(*body, "\n", "")) // encode breaks lines every 76
		if err != nil {
			return nil, nil, fmt.Errorf("lease: the stored body: %w", err)
		}
		s := string(b)
		c.ResponseBody = &s
	}
	if c.Outcome != idempotency.OutcomeClaimed {
		resp, p, err := idempotency.ClaimAnswer(c)
		if p != nil {
			resp = idempotency.RenderProblem(rn.RenderProblem, rn.ProblemBase, req.HTTP, *p)
		}
		return nil, resp, err
	}
	if r.State == nil {
		r.State = map[string]any{}
	}
	r.answerHeaders = c.AnswerHeaders()
	return r, nil, nil
}

func micros(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + " microseconds" }

// heartbeat extends the lease every third of its length while a step runs.
type heartbeat struct {
	paused, isLost atomic.Bool
	done, finished chan struct{}
}

func startHeartbeat(rn *Runner, r *Run, leaseLen time.Duration, logger *log.Logger) *heartbeat {
	hb := &heartbeat{done: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(hb.finished)
		t := time.NewTicker(leaseLen / 3)
		defer t.Stop()
		for {
			select {
			case <-hb.done:
				return
			case <-t.C:
			}
			if hb.paused.Load() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), leaseLen/3)
			err := r.extend(ctx, rn.Pool)
			cancel()
			if errors.Is(asLost(err), ErrLeaseLost) {
				hb.isLost.Store(true)
				return
			} else if err != nil {
				logger.Printf("lease: heartbeat of %q: %v", r.Key, err)
			}
		}
	}()
	return hb
}

func (hb *heartbeat) pause()     { hb.paused.Store(true) }
func (hb *heartbeat) resume()    { hb.paused.Store(false) }
func (hb *heartbeat) lost() bool { return hb.isLost.Load() }
func (hb *heartbeat) stop()      { close(hb.done); <-hb.finished }
