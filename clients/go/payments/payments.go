// Package payments is the payment service of clients/CONTRACT.md: POST /payments behind the idempotency
// middleware, POST /payments-unprotected without it (the benchmark baseline), GET /healthz.
package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"example.com/idempotency"
	"github.com/jackc/pgx/v4"
)

var (
	accountRE  = regexp.MustCompile(`^[a-z0-9_]{1,64}$`)
	currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)
	sleepRE    = regexp.MustCompile(`^sleep=([0-9]{1,9})$`)
)

// Config of the service.
type Config struct {
	// Faults enables the X-Fault request header (PAYMENTS_FAULTS=1).
	Faults bool
	// Logger; nil means log.Default().
	Logger *log.Logger
}

type ctxKey struct{}

// Account is the authenticated account of a request (set by the bearer-token check).
func Account(ctx context.Context) string {
	a, _ := ctx.Value(ctxKey{}).(string)
	return a
}

func problem(status int, slug, title, detail string) *idempotency.Response {
	return idempotency.Problem("", status, slug, title, detail)
}

// authenticate answers 401 unless the request has Authorization: Bearer <account>; the account goes into the
// request's context (and is the idempotency scope).
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Values("Authorization")
		account := ""
		if len(auth) == 1 {
			scheme, token, ok := strings.Cut(auth[0], " ")
			if ok && strings.EqualFold(scheme, "Bearer") && accountRE.MatchString(token) {
				account = token
			}
		}
		if account == "" {
			p := problem(http.StatusUnauthorized, "unauthorized", "Unauthorized",
				"send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}")
			p.Header.Set("WWW-Authenticate", "Bearer")
			p.Write(w)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, account)))
	})
}

func onlyMethod(method string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method {
			p := problem(http.StatusMethodNotAllowed, "method-not-allowed", "Method Not Allowed",
				r.Method+" is not allowed here")
			p.Header.Set("Allow", method)
			p.Write(w)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// NewHandler is the service's HTTP handler over db (a *pgxpool.Pool configured with
// idempotency.ParsePoolConfig).
func NewHandler(db idempotency.DB, cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	s := &service{db: db, cfg: cfg}
	guard := idempotency.New(db, idempotency.Options{
		Scope:         func(r *http.Request) string { return Account(r.Context()) },
		ReplayHeaders: []string{"Content-Type", "Location"},
		Logger:        cfg.Logger,
	})
	mux := http.NewServeMux()
	mux.Handle("/healthz", onlyMethod(http.MethodGet, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})))
	mux.Handle("/payments", onlyMethod(http.MethodPost, authenticate(guard.HandleTx(s.createPayment))))
	mux.Handle("/payments-unprotected", onlyMethod(http.MethodPost, authenticate(http.HandlerFunc(s.unprotected))))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem(http.StatusNotFound, "not-found", "Not Found", r.URL.Path+" is not a resource here").Write(w)
	}))
	return mux
}

type service struct {
	db  idempotency.DB
	cfg Config
}

type paymentRequest struct {
	AmountCents json.RawMessage `json:"amount_cents"`
	Currency    json.RawMessage `json:"currency"`
}

type payment struct {
	PaymentID   int64  `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// validate returns the amount and currency of a payment body, or the detail of a 422.
func validate(body []byte) (int64, string, string) {
	var req paymentRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return 0, "", "the body must be a JSON object {\"amount_cents\": <integer > 0>, \"currency\": \"<ISO 4217>\"}"
	}
	amount, err := strconv.ParseInt(string(bytes.TrimSpace(req.AmountCents)), 10, 64)
	if err != nil || amount <= 0 {
		return 0, "", "amount_cents must be an integer greater than 0"
	}
	var currency string
	if json.Unmarshal(req.Currency, &currency) != nil || !currencyRE.MatchString(currency) {
		return 0, "", "currency must be 3 upper-case letters"
	}
	return amount, currency, ""
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// createPayment is the handler: it runs inside the request's transaction.
func (s *service) createPayment(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	ctx := r.Context()
	var body bytes.Buffer
	if _, err := body.ReadFrom(r.Body); err != nil {
		return err
	}
	if !idempotency.ValidRequestBody(body.Bytes()) {
		problem(http.StatusBadRequest, "request-body-not-json", "Malformed request body",
			"the request body is not JSON").Write(w)
		return nil
	}
	amount, currency, detail := validate(body.Bytes())
	if detail != "" {
		problem(http.StatusUnprocessableEntity, "invalid-payment", "Invalid payment", detail).Write(w)
		return nil
	}
	account := Account(ctx)
	key := idempotency.Key(ctx) // "" on the unprotected route
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, $2::bigint, $3::text, $4::text) RETURNING id`, account, -amount, currency, key).Scan(&id)
	if err != nil {
		return fmt.Errorf("ledger insert: %w", err)
	}
	if s.cfg.Faults {
		switch fault := r.Header.Get("X-Fault"); {
		case fault == "503":
			problem(http.StatusServiceUnavailable, "upstream-unavailable", "Service Unavailable",
				"upstream unavailable").Write(w)
			return nil
		case fault == "db-error":
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err != nil {
				return fmt.Errorf("fault db-error: %w", err)
			}
		case sleepRE.MatchString(fault):
			ms, _ := strconv.Atoi(sleepRE.FindStringSubmatch(fault)[1])
			if _, err := tx.Exec(ctx, `SELECT pg_sleep($1::int / 1000.0)`, ms); err != nil {
				return fmt.Errorf("fault sleep: %w", err)
			}
		}
	}
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
	writeJSON(w, http.StatusCreated, payment{PaymentID: id, Account: account, AmountCents: amount, Currency: currency})
	return nil
}

// unprotected runs the same handler in one transaction without the idempotency middleware.
func (s *service) unprotected(w http.ResponseWriter, r *http.Request) {
	const maxRetries = 3
	var body bytes.Buffer
	if _, err := body.ReadFrom(http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
		problem(http.StatusBadRequest, "request-body-unreadable", "Unreadable request body", err.Error()).Write(w)
		return
	}
	for attempt := 0; ; attempt++ {
		resp, err := s.unprotectedAttempt(r, body.Bytes())
		if err == nil {
			resp.Write(w)
			return
		}
		if idempotency.IsRetryable(err) && attempt < maxRetries {
			continue
		}
		var pe *idempotency.PanicError
		if errors.As(err, &pe) && pe.Value == http.ErrAbortHandler {
			panic(pe.Value)
		}
		s.cfg.Logger.Printf("payments-unprotected: %v (rolled back)", err)
		problem(http.StatusInternalServerError, "internal-error", "Internal Server Error",
			"the request failed and was rolled back").Write(w)
		return
	}
}

func (s *service) unprotectedAttempt(r *http.Request, body []byte) (resp *idempotency.Response, err error) {
	ctx := r.Context()
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	rec := idempotency.NewRecorder()
	hr := r.Clone(ctx)
	hr.Body = http.NoBody
	if len(body) > 0 {
		hr.Body = readCloser{bytes.NewReader(body)}
	}
	if err := idempotency.CallHandler(s.createPayment, rec, hr, tx); err != nil {
		return nil, err
	}
	resp = rec.Response()
	if resp.Status >= 500 {
		return resp, nil
	}
	return resp, tx.Commit(ctx)
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }
