// Package payments is the payment service of clients/CONTRACT.md: POST /payments (and POST /files/<name>)
// behind the idempotency middleware, POST /payments-unprotected without it (the benchmark baseline), GET /healthz.
package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-chi/chi/v5"
	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/echoidem"
	"github.com/idempotency-pg/idempotency/clients/go/ginidem"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
	"github.com/labstack/echo/v4"
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
	// Framework serving POST /payments: "" or "net/http" (Guard.HandleTx), "chi" (Guard.Middleware on a chi
	// router), "echo" (echoidem.Middleware), "gin" (ginidem.Handle). Methods, paths and authentication are
	// checked in front of it alike for all four.
	Framework string
	// RidesLease is the lease length of POST /rides (RIDES_LEASE_SECONDS); 0 means 30 s.
	RidesLease time.Duration
}

// Frameworks are the values of Config.Framework.
var Frameworks = []string{"net/http", "chi", "echo", "gin"}

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

// onlyMethods answers 405 with Allow to a request whose method is not one of methods.
func onlyMethods(next http.Handler, methods ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, m := range methods {
			if r.Method == m {
				next.ServeHTTP(w, r)
				return
			}
		}
		p := problem(http.StatusMethodNotAllowed, "method-not-allowed", "Method Not Allowed",
			r.Method+" is not allowed here")
		p.Header.Set("Allow", strings.Join(methods, ", "))
		p.Write(w)
	})
}

// NewHandler is the service's HTTP handler over db (a *pgxpool.Pool configured with
// idempotency.ParsePoolConfig).
func NewHandler(db idempotency.DB, cfg Config) (http.Handler, error) {
	if cfg.Logger == nil {
		cfg.Logger = log.Default()
	}
	s := &service{db: db, cfg: cfg}
	guard := idempotency.New(db, idempotency.Options{
		Scope:         func(r *http.Request) string { return Account(r.Context()) },
		ReplayHeaders: []string{"Content-Type", "Location"},
		Logger:        cfg.Logger,
		MaxBodyBytes:  MaxBodyBytes,
	})
	payments, err := s.paymentsHandler(guard)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/healthz", onlyMethods(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}), http.MethodGet, http.MethodHead))
	mux.Handle("/payments", onlyMethods(authenticate(payments), http.MethodPost))
	// POST /payments at any path under /files/ (CONTRACT.md, rule raw-target): the fingerprint has the target as sent.
	mux.Handle("/files/", onlyMethods(authenticate(payments), http.MethodPost))
	if pool, ok := db.(*pgxpool.Pool); ok {
		mux.Handle("/rides", onlyMethods(authenticate(s.ridesHandler(pool, guard)), http.MethodPost))
	}
	mux.Handle("/payments-unprotected", onlyMethods(authenticate(s.unprotected(guard)), http.MethodPost))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		problem(http.StatusNotFound, "not-found", "Not Found", r.URL.Path+" is not a resource here").Write(w)
	}))
	return mux, nil
}

// MaxBodyBytes is the request body limit of every route (CONTRACT.md "body-limit"): 1 MiB.
const MaxBodyBytes = 1 << 20

// paymentsHandler serves POST /payments with the framework of the configuration. Each answers the X-Fault
// throw-<status> with its own framework's error, raised after the ledger insert.
func (s *service) paymentsHandler(guard *idempotency.Guard) (http.Handler, error) {
	switch s.cfg.Framework {
	case "", "net/http":
		return guard.HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			thrown, err := s.createPayment(w, r, tx)
			if thrown != 0 {
				return &idempotency.HTTPError{Status: thrown, Detail: "thrown by the handler"}
			}
			return err
		}), nil
	case "chi":
		r := chi.NewRouter()
		pay := func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			thrown, err := s.createPayment(w, r, idempotency.Tx(ctx))
			if thrown != 0 {
				err = &idempotency.HTTPError{Status: thrown, Detail: "thrown by the handler"}
			}
			if err != nil {
				idempotency.Fail(ctx, err)
			}
		}
		r.With(guard.Middleware).Post("/payments", pay)
		r.With(guard.Middleware).Post("/files/*", pay)
		return r, nil
	case "echo":
		e := echo.New()
		e.HideBanner, e.HidePort = true, true
		// Errors as problem+json, like the other routes (echo's default writes {"message": ...}); echoidem runs
		// this inside the transaction, so the status it picks is the status stored.
		e.HTTPErrorHandler = func(err error, c echo.Context) {
			if c.Response().Committed {
				return
			}
			var he *echo.HTTPError
			if errors.As(err, &he) {
				problem(he.Code, "http-"+strconv.Itoa(he.Code), http.StatusText(he.Code), fmt.Sprint(he.Message)).Write(c.Response())
				return
			}
			s.cfg.Logger.Printf("payments: %v", err)
			problem(http.StatusInternalServerError, "internal-error", "Internal Server Error",
				"the request failed and was rolled back").Write(c.Response())
		}
		pay := func(c echo.Context) error {
			thrown, err := s.createPayment(c.Response(), c.Request(), idempotency.Tx(c.Request().Context()))
			if thrown != 0 {
				return echo.NewHTTPError(thrown, "thrown by the handler")
			}
			return err
		}
		e.POST("/payments", pay, echoidem.Middleware(guard))
		e.POST("/files/*", pay, echoidem.Middleware(guard))
		return e, nil
	case "gin":
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		pay := ginidem.Handle(guard, func(c *gin.Context) {
			thrown, err := s.createPayment(c.Writer, c.Request, idempotency.Tx(c.Request.Context()))
			switch {
			case err != nil:
				_ = c.Error(err)
			case thrown != 0:
				_ = c.AbortWithError(thrown, errors.New("thrown by the handler")).SetType(gin.ErrorTypePublic)
			}
		})
		r.POST("/payments", pay)
		r.POST("/files/*name", pay)
		return r, nil
	}
	return nil, fmt.Errorf("payments: unknown framework %q (one of %s)", s.cfg.Framework, strings.Join(Frameworks, ", "))
}

type service struct {
	db  idempotency.DB
	cfg Config
}

// MaxAmountCents is the largest amount_cents (CONTRACT.md): 2^53 - 1, the largest integer every JSON parser holds
// exactly (I-JSON, RFC 7493), so every client answers the same amount the same way.
const MaxAmountCents = 1<<53 - 1

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
	if err != nil || amount <= 0 || amount > MaxAmountCents {
		return 0, "", "amount_cents must be an integer from 1 to 9007199254740991"
	}
	var currency string
	if json.Unmarshal(req.Currency, &currency) != nil || !currencyRE.MatchString(currency) {
		return 0, "", "currency must be 3 upper-case letters"
	}
	return amount, currency, ""
}

// createPayment is the handler: it runs inside the request's transaction. thrown is the status of an X-Fault
// throw-<status>, which the caller raises as its framework's own HTTP error.
func (s *service) createPayment(w http.ResponseWriter, r *http.Request, tx pgx.Tx) (thrown int, err error) {
	ctx := r.Context()
	var body bytes.Buffer
	if _, err := body.ReadFrom(r.Body); err != nil {
		return 0, err
	}
	if !idempotency.ValidRequestBody(body.Bytes()) {
		idempotency.NotExecuted(ctx)
		notJSON().Write(w)
		return 0, nil
	}
	amount, currency, detail := validate(body.Bytes())
	if detail != "" {
		// Refused before any write: sent, not stored, the key released for the corrected request.
		idempotency.NotExecuted(ctx)
		problem(http.StatusUnprocessableEntity, "invalid-payment", "Invalid payment", detail).Write(w)
		return 0, nil
	}
	account := Account(ctx)
	key := idempotency.Key(ctx) // "" on the unprotected route
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, $2::bigint, $3::text, $4::text) RETURNING id`, account, -amount, currency, key).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("ledger insert: %w", err)
	}
	if s.cfg.Faults {
		switch fault := r.Header.Get("X-Fault"); {
		case fault == "503":
			problem(http.StatusServiceUnavailable, "upstream-unavailable", "Service Unavailable",
				"upstream unavailable").Write(w)
			return 0, nil
		case fault == "throw-422":
			return http.StatusUnprocessableEntity, nil
		case fault == "throw-502":
			return http.StatusBadGateway, nil
		case fault == "db-error":
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err != nil {
				return 0, fmt.Errorf("fault db-error: %w", err)
			}
		case sleepRE.MatchString(fault):
			ms, _ := strconv.Atoi(sleepRE.FindStringSubmatch(fault)[1])
			if _, err := tx.Exec(ctx, `SELECT pg_sleep($1::int / 1000.0)`, ms); err != nil {
				return 0, fmt.Errorf("fault sleep: %w", err)
			}
		}
	}
	b, _ := json.Marshal(payment{PaymentID: id, Account: account, AmountCents: amount, Currency: currency})
	w.Header().Set("Location", "/payments/"+strconv.FormatInt(id, 10))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(b)
	return 0, nil
}

// unprotected runs the same handler in one transaction without the idempotency middleware (the body read as the
// Guard reads it): the benchmark's baseline. A 5xx rolls back; 40001/40P01 runs the transaction again.
func (s *service) unprotected(guard *idempotency.Guard) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, refused := guard.ReadBody(r)
		for attempt := 0; refused == nil; attempt++ {
			rec := idempotency.NewRecorder()
			hr := r.Clone(r.Context())
			hr.Body = io.NopCloser(bytes.NewReader(body))
			err := func() error {
				tx, err := s.db.BeginTx(r.Context(), pgx.TxOptions{})
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				thrown, err := s.createPayment(rec, hr, tx)
				if thrown != 0 {
					problem(thrown, "http-"+strconv.Itoa(thrown), http.StatusText(thrown), "thrown by the handler").Write(rec)
				}
				if err == nil && rec.Response().Status >= 500 {
					return errRolledBack
				} else if err != nil {
					return err
				}
				return tx.Commit(r.Context())
			}()
			switch {
			case err == nil || errors.Is(err, errRolledBack):
				refused = rec.Response()
			case idempotency.IsRetryable(err) && attempt < 3:
			default:
				s.cfg.Logger.Printf("payments-unprotected: %v (rolled back)", err)
				refused = problem(http.StatusInternalServerError, "internal-error", "Internal Server Error",
					"the request failed and was rolled back")
			}
		}
		refused.Write(w)
	})
}

var errRolledBack = errors.New("a 5xx answer: rolled back")

func notJSON() *idempotency.Response {
	return problem(http.StatusBadRequest, "request-body-not-json", "Malformed request body", "the request body is not JSON")
}
