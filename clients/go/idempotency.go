// Package idempotency is the Go client of the idempotency PostgreSQL extension: net/http middleware that honours
// the Idempotency-Key request header by claiming the key, running the handler and storing its response in one
// database transaction, the same transaction as the handler's own writes.
//
// Per request: the key is parsed (400 problem+json when missing or invalid), the body is read whole, whatever its
// type, and never parsed (413 over Options.MaxBodyBytes, before any claim); its bytes and Content-Type go to the
// claim, and the handler reads the body as it would without the middleware. With the statements of extension 1.3
//
//	BEGIN
//	idem_claim_request(key, scope, method, path, query, content type, body, ttl)
//	  claimed     -> the handler runs inside the transaction; its response is buffered;
//	                 idem_complete_request(key, scope, status, content type, headers, body bytes); COMMIT; the
//	                 response is sent
//	  replay      -> ROLLBACK; the stored response, plus Idempotent-Replayed: true
//	  mismatch    -> ROLLBACK; 422 problem+json (idempotency-key-reused)
//	  in_progress -> ROLLBACK; 409 problem+json, Retry-After: 1
//	  expired     -> ROLLBACK; 410 problem+json (idempotency-key-expired)
//
// The answers the middleware writes itself go through Options.RenderProblem (default problem+json).
//
// Pipelined over prepared statements (the default with a *pgxpool.Pool or a *pgx.Conn), the claim goes first and
// BEGIN follows it for a claimed key only, taking the claim into the transaction; any other outcome ends the
// claim's own transaction, in which it wrote nothing, with no BEGIN nor ROLLBACK.
//
// A 5xx from the handler, a returned error, a panic or a failed statement roll everything back: nothing is
// stored, the handler's writes are undone, the key is free for a retry. SQLSTATE 40001 or 40P01 anywhere runs the
// whole transaction again (Options.MaxRetries times at most).
//
// The handler reaches the transaction with Tx(r.Context()), or receives it directly with Guard.HandleTx.
package idempotency

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

// DB begins the transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type DB interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Options configure a Guard. The zero value works: scope "", the extension's default ttl, 3 retries.
type Options struct {
	// Scope gives the idempotency scope of a request: the authenticated tenant or account, never a value the client
	// picks freely. nil means the scope "".
	Scope func(r *http.Request) string
	// TTL of the stored response; 0 means the extension's idempotency.ttl.
	TTL time.Duration
	// MaxRetries is how many times the whole transaction is run again after SQLSTATE 40001/40P01. 0 means 3;
	// a negative value means no retry.
	MaxRetries int
	// Methods guarded; other methods pass through to the handler untouched (with no transaction). nil means
	// POST, PUT, PATCH, DELETE.
	Methods []string
	// ReplayHeaders is the allow-list of response headers stored for a replay. nil means every header but the
	// per-connection ones (Date, Content-Length, Set-Cookie, ...).
	ReplayHeaders []string
	// TxOptions of the transaction (isolation level); the zero value is the server default (READ COMMITTED).
	TxOptions pgx.TxOptions
	// MaxBodyBytes limits the request body; 0 means 1 MiB (1048576 bytes). A bigger body is answered 413
	// problem+json request-too-large before any claim (a Content-Length over it without reading the body).
	MaxBodyBytes int64
	// ProblemBase prefixes problem types; "" means DefaultProblemBase.
	ProblemBase string
	// RenderProblem writes the answers the middleware writes itself (CONTRACT.md "error-shape": key missing,
	// invalid or several, in progress, expired, too large, reused, internal error) in the API's own shape, with
	// p.Header (Retry-After on 409). nil means application/problem+json.
	RenderProblem RenderProblemFunc
	// Redact are JSON Pointers (RFC 6901: /card/number) of members dropped from a JSON object response before it
	// is stored (CONTRACT.md "store-less"); the first answer is sent whole, the stored headers gain
	// Idempotent-Replay-Redacted with the pointers dropped, and a replay answers the body without them.
	Redact []string
	// OmitBody stores only the status and the headers of a response (its body NULL, no content type); the stored
	// headers gain Idempotent-Replay-Body: omitted and a replay answers an empty body.
	OmitBody bool
	// Logger for database and handler errors; nil means log.Default().
	Logger *log.Logger
	// NoPipeline sends BEGIN, idem_claim, idem_complete and COMMIT as four round trips instead of two batches (BEGIN
	// with the claim, the completion with COMMIT). Only a *pgxpool.Pool or a *pgx.Conn is pipelined; any other DB
	// runs unpipelined anyway. The handler then gets pgx's own Tx (needed for LargeObjects).
	NoPipeline bool
	// ClaimTimeout bounds the claim's exchange with the server (not the wait for a pool's connection): the claim
	// and, over prepared statements, the Sync (and for a claimed key the BEGIN) that follow it. Until that Sync the
	// server arms no timeout of its own (idle_in_transaction_session_timeout starts at a ReadyForQuery), so a
	// client stalled there would hold the key's lock with no bound; past the deadline the connection is closed,
	// which ends the claim's transaction and frees the key, and the request is answered 500. 0 means
	// DefaultClaimTimeout; a negative value, none (only the request's context).
	ClaimTimeout time.Duration
}

// DefaultClaimTimeout is Options.ClaimTimeout's default: the claim never waits for a lock (a duplicate gets
// in_progress at once), so it answers in milliseconds unless the server or the network is stuck.
const DefaultClaimTimeout = 5 * time.Second

// Guard applies the idempotency protocol to handlers.
type Guard struct {
	db    DB
	sqlDB *sql.DB
	opts  Options
}

// New returns a Guard that begins its transactions on db.
func New(db DB, opts Options) *Guard {
	if opts.MaxRetries == 0 {
		opts.MaxRetries = 3
	} else if opts.MaxRetries < 0 {
		opts.MaxRetries = 0
	}
	if opts.Methods == nil {
		opts.Methods = []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = log.Default()
	}
	if opts.ClaimTimeout == 0 {
		opts.ClaimTimeout = DefaultClaimTimeout
	}
	return &Guard{db: db, opts: opts}
}

// Middleware is New(db, opts).Middleware, for routers that take func(http.Handler) http.Handler.
func Middleware(db DB, opts Options) func(http.Handler) http.Handler {
	return New(db, opts).Middleware
}

// TxHandlerFunc is a handler that runs inside the request's transaction. It writes its response to w (buffered
// until the transaction commits). Returning an error rolls the transaction back and answers 500 (or runs the
// transaction again, for 40001/40P01 anywhere in the error's chain).
type TxHandlerFunc func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error

// Middleware wraps an ordinary http.Handler. It finds the transaction with Tx(r.Context()); to roll back for a
// database error (and have 40001/40P01 retried) it calls Fail(r.Context(), err), or panics.
func (g *Guard) Middleware(next http.Handler) http.Handler {
	return g.handle(next, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		next.ServeHTTP(w, r)
		return nil
	})
}

// HandleTx returns a handler running h inside the request's transaction. A request whose method is not guarded
// (Options.Methods) runs h with a nil tx and no transaction.
func (g *Guard) HandleTx(h TxHandlerFunc) http.Handler {
	return g.handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = h(w, r, nil)
	}), h)
}

type ctxKey int

const (
	txKey ctxKey = iota
	stateKey
	sqlKey
)

type requestState struct {
	key, scope  string
	attempt     int
	err         error
	notExecuted bool
}

// Tx is the transaction of a guarded request (nil outside one).
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey).(pgx.Tx)
	return tx
}

// stateOf is the state of the guarded request of ctx, a zero state outside one.
func stateOf(ctx context.Context) *requestState {
	if s, ok := ctx.Value(stateKey).(*requestState); ok {
		return s
	}
	return &requestState{}
}

// Key is the parsed Idempotency-Key of a guarded request.
func Key(ctx context.Context) string { return stateOf(ctx).key }

// Scope is the scope the key was claimed in.
func Scope(ctx context.Context) string { return stateOf(ctx).scope }

// Attempt is 0 on the first run of the transaction, 1.. on runs after 40001/40P01.
func Attempt(ctx context.Context) int { return stateOf(ctx).attempt }

// Fail marks the guarded request failed with err, as if a TxHandlerFunc had returned it: whatever the handler
// writes is dropped, the transaction rolls back, and the client gets 500 (or the transaction runs again, for
// 40001/40P01). It reports whether ctx belongs to a guarded request.
func Fail(ctx context.Context, err error) bool {
	s, ok := ctx.Value(stateKey).(*requestState)
	if ok && s.err == nil {
		s.err = err
	}
	return ok
}

// HTTPError is an error a handler returns (or passes to Fail) to answer with a status, the net/http counterpart of
// a framework's HTTP error (echo.NewHTTPError, gin's AbortWithError): the middleware answers it as problem+json
// in place of anything the handler wrote, and treats that answer like any other: a status below 500 is stored
// and committed with the handler's writes, a 5xx rolls back.
type HTTPError struct {
	Status int
	Title  string // "" means the status text
	Detail string
	Err    error // the cause, for errors.Is/As and the log
}

func (e *HTTPError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("HTTP %d: %v", e.Status, e.Err)
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Detail)
}

func (e *HTTPError) Unwrap() error { return e.Err }

// NotExecuted marks the guarded request as not executed: the handler refused it before doing anything (a body
// that fails validation, say) and answers with a 4xx that is sent but not stored. The transaction rolls back,
// which also frees the key, so the client can correct the request and send it again with the same key (as Stripe
// does for a request that fails validation). It reports whether ctx belongs to a guarded request.
func NotExecuted(ctx context.Context) bool {
	s, ok := ctx.Value(stateKey).(*requestState)
	if ok {
		s.notExecuted = true
	}
	return ok
}

// IsRetryable reports whether err carries SQLSTATE 40001 (serialization_failure) or 40P01 (deadlock_detected).
func IsRetryable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == "40001" || pg.Code == "40P01")
}

// badBodyCodes are SQLSTATEs of the claim statement meaning PostgreSQL does not take the body as jsonb.
var badBodyCodes = map[string]bool{"22P02": true, "22P05": true, "22003": true, "22021": true}

var errBadBody = errors.New("request body is not JSON")

// PanicError is a recovered panic of the handler.
type PanicError struct {
	Value any
	Stack []byte
}

func (p *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", p.Value) }

// The statements of extension 1.3 (clients/CONTRACT.md "Statements of 1.3"): the claim computes the request's
// fingerprint itself, the completion stores the response's bytes. Neither function is overloaded, so the
// statements need no casts and are prepared as they are (pgx's statement cache) or sent unprepared alike.
const (
	claimSQL    = `SELECT idem_claim_request($1, $2, $3, $4, $5, $6, $7, $8)`
	completeSQL = `SELECT idem_complete_request($1, $2, $3, $4, $5, $6)`
)

// Guards reports whether requests with this method go through the protocol (Options.Methods); framework
// adapters pass the others straight to the handler.
func (g *Guard) Guards(method string) bool {
	for _, m := range g.opts.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// problem is an answer the middleware writes itself, through Options.RenderProblem.
func (g *Guard) problem(r *http.Request, status int, slug, title, detail string) *Response {
	return g.Render(r, ProblemDetails{Status: status, Type: slug, Title: title, Detail: detail, Header: http.Header{}})
}

// Render is the answer to p as Options.RenderProblem writes it (problem+json when it is nil), for a service's own
// refusals in the shape of the Guard's.
func (g *Guard) Render(r *http.Request, p ProblemDetails) *Response {
	return RenderProblem(g.opts.RenderProblem, g.opts.ProblemBase, r, p)
}

func (g *Guard) handle(passthrough http.Handler, h TxHandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Guards(r.Method) {
			passthrough.ServeHTTP(w, r)
			return
		}
		g.serve(w, r, h)
	})
}

func (g *Guard) serve(w http.ResponseWriter, r *http.Request, h TxHandlerFunc) {
	key, refused := g.ReadKey(r)
	if refused == nil {
		var raw []byte
		if raw, refused = g.ReadBody(r); refused == nil {
			g.run(w, r, key, raw, h)
			return
		}
	}
	refused.Write(w)
}

// ReadKey parses the request's Idempotency-Key (ParseKey); a non-nil Response is the 400 problem+json to answer
// instead.
func (g *Guard) ReadKey(r *http.Request) (string, *Response) {
	key, err := ParseKey(r.Header.Values("Idempotency-Key"))
	if err != nil {
		ke := err.(*KeyError)
		title := "Invalid Idempotency-Key"
		if ke.Missing {
			title = "Idempotency-Key required"
		}
		return "", g.problem(r, http.StatusBadRequest, ke.Slug(), title, ke.Reason)
	}
	return key, nil
}

// ReadBody reads the request body whole, as the Guard does before any claim. A non-nil Response is the answer
// that ends the request there, nothing claimed: 413 for a Content-Length over Options.MaxBodyBytes (refused
// unread) or a body that passes the limit (cut off there), 400 for a body that did not arrive whole (a failed
// read, or fewer bytes than its Content-Length: the client hung up). Each refusal closes the connection, so the
// server reads no more of the body.
func (g *Guard) ReadBody(r *http.Request) ([]byte, *Response) {
	var (
		refused *ProblemDetails
		raw     []byte
		err     error
	)
	if r.ContentLength <= g.opts.MaxBodyBytes {
		raw, err = io.ReadAll(io.LimitReader(r.Body, g.opts.MaxBodyBytes+1))
	}
	switch {
	case r.ContentLength > g.opts.MaxBodyBytes || int64(len(raw)) > g.opts.MaxBodyBytes:
		refused = &ProblemDetails{Status: http.StatusRequestEntityTooLarge, Type: "request-too-large",
			Title:  "Request body too large",
			Detail: fmt.Sprintf("the request body is over %d bytes (Options.MaxBodyBytes)", g.opts.MaxBodyBytes)}
	case err == nil && int64(len(raw)) < r.ContentLength:
		err = fmt.Errorf("%d bytes of a body of %d (Content-Length)", len(raw), r.ContentLength)
		fallthrough
	case err != nil:
		refused = &ProblemDetails{Status: http.StatusBadRequest, Type: "request-body-unreadable",
			Title: "Unreadable request body", Detail: "the request body did not arrive whole: " + err.Error()}
	default:
		return raw, nil
	}
	refused.Header = http.Header{"Connection": {"close"}}
	return nil, g.Render(r, *refused)
}

// run runs the attempts of a request whose key and body were read: the transaction, again after 40001/40P01.
func (g *Guard) run(w http.ResponseWriter, r *http.Request, key string, raw []byte, h TxHandlerFunc) {
	scope := ""
	if g.opts.Scope != nil {
		scope = g.opts.Scope(r)
	}
	// The body's bytes and its Content-Type (NULL when absent) as they came (CONTRACT.md "any-body"): the claim
	// fingerprints a JSON media type (or a body with no type) canonically, anything else as bytes.
	path, query := RequestTarget(r)
	req := attemptInput{key: key, scope: scope, method: r.Method, path: path, query: query, body: raw,
		contentType: RequestContentType(r)}

	for attempt := 0; ; attempt++ {
		resp, err := g.attempt(r, req, attempt, h)
		if err == nil {
			resp.Write(w)
			return
		}
		detail := "the request failed and was rolled back"
		var pe *PanicError
		var pg *pgconn.PgError
		switch {
		case IsRetryable(err) && attempt < g.opts.MaxRetries:
			g.opts.Logger.Printf("idempotency: %v on attempt %d, running the transaction again", err, attempt+1)
			continue
		case IsRetryable(err):
			g.Render(r, ProblemDetails{Status: http.StatusConflict, Type: "transaction-conflict", Title: "Conflict",
				Detail: "the request kept conflicting with concurrent requests; retry it",
				Header: http.Header{"Retry-After": {"1"}}}).Write(w)
			return
		case errors.Is(err, errBadBody):
			g.badBody(r).Write(w)
			return
		case errors.Is(err, errNoResponse):
			g.opts.Logger.Printf("%v", err)
			detail = "the handler sent no response; the request was rolled back"
		case errors.As(err, &pe):
			if pe.Value == http.ErrAbortHandler {
				panic(pe.Value) // the handler asked net/http to abort the connection
			}
			g.opts.Logger.Printf("idempotency: %v (rolled back)\n%s", err, pe.Stack)
		default:
			g.opts.Logger.Printf("idempotency: %v (rolled back)", err)
			if errors.As(err, &pg) {
				detail = fmt.Sprintf("database error (SQLSTATE %s); the request was rolled back", pg.Code)
			}
		}
		g.problem(r, http.StatusInternalServerError, "internal-error", "Internal Server Error", detail).Write(w)
		return
	}
}

// RequestTarget is the path and the query of r's request line as the client sent them, the parts
// idem_claim_request fingerprints (CONTRACT.md): the request target split at its first '?', neither part decoded
// nor normalised, whatever routing made of r.URL (a mount prefix stripped, a path decoded): /files/a%2Fb stays
// apart from /files/a/b, %41 from A, and a trailing '?' is an empty query, which the fingerprint takes as none.
// An absolute-form target (http://host/p) is taken as sent, as by the other clients. A request made in process
// (no RequestURI) gives r.URL's escaped path and raw query.
func RequestTarget(r *http.Request) (path, query string) {
	target := r.RequestURI
	if target == "" {
		target = r.URL.RequestURI()
	}
	path, query, _ = strings.Cut(target, "?")
	return path, query
}

// RequestContentType is r's Content-Type as idem_claim_request takes it: nil (NULL) when the request has none,
// its lines joined with ", " when it has several.
func RequestContentType(r *http.Request) any {
	if v := r.Header.Values("Content-Type"); len(v) > 0 {
		return strings.Join(v, ", ")
	}
	return nil
}

// badBody answers a body the claim cannot fingerprint: one of a JSON media type (or of none) that is not JSON.
func (g *Guard) badBody(r *http.Request) *Response {
	return g.problem(r, http.StatusBadRequest, "request-body-not-json", "Malformed request body",
		"the request body is not JSON")
}

type attemptInput struct {
	key, scope, method, path, query string
	contentType                     any
	body                            []byte
}

func (g *Guard) ttl() any {
	if g.opts.TTL <= 0 {
		return nil
	}
	return strconv.FormatInt(g.opts.TTL.Microseconds(), 10) + " microseconds"
}

// rollback ends tx even when the request's context is already cancelled.
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// errNoResponse: the handler returned without writing a status. What the client would get depends on code that
// runs after the middleware (a framework's error handler, net/http's implicit 200), so nothing is committed.
var errNoResponse = errors.New("idempotency: the handler returned without writing a response; rolled back")

// attempt runs one transaction. It returns the response to send, or the error that rolled it back.
func (g *Guard) attempt(r *http.Request, in attemptInput, attempt int, h TxHandlerFunc) (*Response, error) {
	ctx := r.Context()
	s, err := g.newSession(ctx)
	if err != nil {
		return nil, err
	}
	defer s.close() // rolls back unless finish committed

	cctx, cancel := ctx, context.CancelFunc(func() {})
	if g.opts.ClaimTimeout > 0 {
		cctx, cancel = context.WithTimeout(ctx, g.opts.ClaimTimeout)
	}
	c, err := s.claim(cctx, []any{in.key, in.scope, in.method, in.path, in.query, in.contentType, in.body, g.ttl()})
	cancel()
	if err != nil {
		var pg *pgconn.PgError
		if errors.As(err, &pg) && badBodyCodes[pg.Code] {
			return nil, errBadBody
		}
		return nil, err
	}
	early, p, err := ClaimAnswer(c)
	if p != nil {
		early = g.Render(r, *p)
	}
	if early != nil || err != nil {
		return early, err // replay, mismatch, in_progress, expired: close rolls the transaction back
	}

	tx, q := s.handlerTx()
	state := &requestState{key: in.key, scope: in.scope, attempt: attempt}
	hctx := context.WithValue(context.WithValue(ctx, txKey, tx), stateKey, state)
	if q != nil {
		hctx = context.WithValue(hctx, sqlKey, q)
	}
	hr := r.Clone(hctx)
	hr.Body = io.NopCloser(bytes.NewReader(in.body))
	hr.ContentLength = int64(len(in.body))
	rec := NewRecorder()
	err = CallHandler(h, rec, hr, tx)
	if err == nil {
		err = state.err
	}
	var he *HTTPError
	if errors.As(err, &he) && !IsRetryable(err) {
		// The handler's answer is the error's status: rendered here, so that what is stored is what is sent.
		title := he.Title
		if title == "" {
			title = http.StatusText(he.Status)
		}
		rec = NewRecorder()
		Problem(g.opts.ProblemBase, he.Status, "http-"+strconv.Itoa(he.Status), title, he.Detail).Write(rec)
		if he.Status >= 500 {
			g.opts.Logger.Printf("idempotency: %v (rolled back)", err)
		}
	} else if err != nil {
		return nil, err
	}
	if !rec.Written() {
		return nil, errNoResponse
	}
	resp := rec.Response()
	if resp.Status >= 500 || state.notExecuted {
		// Not stored: close rolls back the handler's writes and the claim, so the key is free for a retry.
		return resp, nil
	}
	// The bytes sent are the bytes stored: every replay is the first answer, byte for byte (but for the members
	// Options.Redact drops and a body Options.OmitBody leaves out, which never reach the row).
	contentType, headers, body := StoreLess{Redact: g.opts.Redact, OmitBody: g.opts.OmitBody}.Stored(resp, g.opts.ReplayHeaders)
	if err := s.finish(ctx, []any{in.key, in.scope, resp.Status, contentType, headers, body}); err != nil {
		return nil, err
	}
	// The key's expiry (CONTRACT.md "key-lifetime"), added after what was stored: a replay gets it from the server.
	AddHeaders(resp.Header, c.AnswerHeaders())
	return resp, nil
}

// AddHeaders sets each of extra's headers on h (the claim's AnswerHeaders on a stored first answer).
func AddHeaders(h, extra http.Header) {
	for k, vs := range extra {
		h[k] = append([]string(nil), vs...)
	}
}

// CallHandler runs h, turning a panic into a *PanicError.
func CallHandler(h TxHandlerFunc, w http.ResponseWriter, r *http.Request, tx pgx.Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h(w, r, tx)
}

// Recorder buffers a handler's response (an http.ResponseWriter); Response gives what was written.
type Recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

// Written reports whether the handler wrote a status or a body.
func (rec *Recorder) Written() bool { return rec.status != 0 }

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{header: http.Header{}} }

func (rec *Recorder) Header() http.Header { return rec.header }

func (rec *Recorder) WriteHeader(status int) {
	if rec.status == 0 {
		rec.status = status
	}
}

func (rec *Recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	return rec.body.Write(b)
}

// Flush does nothing: the response is buffered until the transaction commits (it exists so that handlers and
// frameworks that flush, such as echo's Response.Flush, work unchanged).
func (rec *Recorder) Flush() {}

// Response is the recorded response (status 200 when the handler set none).
func (rec *Recorder) Response() *Response {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	h := rec.header.Clone()
	if h.Get("Content-Type") == "" && rec.body.Len() > 0 {
		h.Set("Content-Type", http.DetectContentType(rec.body.Bytes()))
	}
	return &Response{Status: status, Header: h, Body: rec.body.Bytes()}
}
