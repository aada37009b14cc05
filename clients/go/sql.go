package idempotency

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/stdlib"
)

// Querier is what a database/sql handler gets: the statements of the request's transaction. *sql.Conn and *sql.Tx
// both satisfy it, as does the DBTX interface sqlc generates.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// SQLHandlerFunc is a database/sql handler running inside the request's transaction (see TxHandlerFunc).
type SQLHandlerFunc func(w http.ResponseWriter, r *http.Request, q Querier) error

// NewSQL returns a Guard over a database/sql pool of the pgx driver (OpenSQL, or stdlib.OpenDB). Its handlers get
// the transaction as a Querier: SQL(r.Context()), or the argument of HandleSQL.
//
// Pipelined (the default), the request holds one *sql.Conn; BEGIN travels with the claim and the completion with
// COMMIT as pgx batches on the pgx connection underneath (sql.Conn.Raw), and the handler's Querier is that
// *sql.Conn, inside the transaction. database/sql does not know about that transaction: the handler must not call
// BeginTx on it. With Options.NoPipeline the handler gets a *sql.Tx (BeginTx on one *sql.Conn of db, whose pgx
// connection sends the claim; four more round trips).
func NewSQL(db *sql.DB, opts Options) *Guard {
	g := New(nil, opts)
	g.sqlDB = db
	return g
}

// OpenSQL opens a database/sql pool of the pgx driver with NewPool's protocol: prepared statements (pgx's
// statement cache), or the simple protocol with prefer_simple_protocol=true in the string or behind a pooler such
// as PgBouncer, which it connects once to detect (BehindPooler; within 30 s). pool_max_conns in the string does
// not apply: size it with db.SetMaxOpenConns / SetMaxIdleConns.
func OpenSQL(connString string) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if cfg.PreferSimpleProtocol {
		cfg.BuildStatementCache = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := chooseProtocol(ctx, cfg, connString); err != nil {
		return nil, err
	}
	return stdlib.OpenDB(*cfg), nil
}

// HandleSQL is HandleTx for a Guard made with NewSQL.
func (g *Guard) HandleSQL(h SQLHandlerFunc) http.Handler {
	return g.handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = h(w, r, nil)
	}), func(w http.ResponseWriter, r *http.Request, _ pgx.Tx) error {
		return h(w, r, SQL(r.Context()))
	})
}

// SQL is the transaction of a guarded request of a NewSQL Guard (nil outside one).
func SQL(ctx context.Context) Querier {
	q, _ := ctx.Value(sqlKey).(Querier)
	return q
}

// sqlTxSession: database/sql, unpipelined. The transaction is begun on one *sql.Conn, so that the claim can go
// through the pgx connection underneath with its result in binary (claimOn).
type sqlTxSession struct {
	db   *sql.DB
	ctx  context.Context // the request's: database/sql rolls the transaction back when the context of BeginTx ends
	opts pgx.TxOptions
	conn *sql.Conn
	t    *sql.Tx
}

// sqlIsolation maps pgx's isolation levels to database/sql's; "" (the server's default) maps to LevelDefault.
var sqlIsolation = map[pgx.TxIsoLevel]sql.IsolationLevel{pgx.Serializable: sql.LevelSerializable,
	pgx.RepeatableRead: sql.LevelRepeatableRead, pgx.ReadCommitted: sql.LevelReadCommitted,
	pgx.ReadUncommitted: sql.LevelReadUncommitted}

func sqlTxOptions(o pgx.TxOptions) *sql.TxOptions {
	return &sql.TxOptions{Isolation: sqlIsolation[o.IsoLevel], ReadOnly: o.AccessMode == pgx.ReadOnly}
}

func (s *sqlTxSession) claim(ctx context.Context, args []any) (c ClaimRow, err error) {
	if s.conn, err = s.db.Conn(s.ctx); err != nil {
		return c, err
	}
	if s.t, err = s.conn.BeginTx(s.ctx, sqlTxOptions(s.opts)); err != nil {
		return c, err
	}
	err = s.conn.Raw(func(dc any) error {
		pc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("idempotency: NewSQL needs the pgx driver (stdlib), got %T", dc)
		}
		c, err = claimOn(ctx, pc.Conn(), args)
		return err
	})
	return c, err
}

func (s *sqlTxSession) handlerTx() (pgx.Tx, Querier) { return nil, s.t }

func (s *sqlTxSession) finish(ctx context.Context, args []any) error {
	if err := s.t.QueryRowContext(ctx, completeSQL, args...).Scan(new(bool)); err != nil {
		return err
	}
	return s.t.Commit()
}

func (s *sqlTxSession) close() {
	if s.t != nil {
		_ = s.t.Rollback()
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
}

// sqlPipeSession: database/sql, pipelined through the pgx connection underneath a *sql.Conn (reached inside
// sql.Conn.Raw for each batch, as Raw requires).
type sqlPipeSession struct {
	conn *sql.Conn
	pipe pipeSession // the batches; its conn is set inside each Raw call
}

func newSQLPipeSession(ctx context.Context, db *sql.DB, begin string) (*sqlPipeSession, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &sqlPipeSession{conn: conn, pipe: pipeSession{release: func() {}, begin: begin, beginFirst: true}}, nil
}

// raw runs fn with the session's batches bound to the pgx connection underneath.
func (s *sqlPipeSession) raw(fn func(p *pipeSession) error) error {
	return s.conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("idempotency: NewSQL needs the pgx driver (stdlib), got %T; or set Options.NoPipeline", dc)
		}
		s.pipe.conn = c.Conn()
		defer func() { s.pipe.conn = nil }()
		return fn(&s.pipe)
	})
}

func (s *sqlPipeSession) claim(ctx context.Context, args []any) (c ClaimRow, err error) {
	err = s.raw(func(p *pipeSession) error {
		c, err = p.claim(ctx, args)
		return err
	})
	return c, err
}

func (s *sqlPipeSession) handlerTx() (pgx.Tx, Querier) { return nil, s.conn }

func (s *sqlPipeSession) finish(ctx context.Context, args []any) error {
	return s.raw(func(p *pipeSession) error { return p.finish(ctx, args) })
}

func (s *sqlPipeSession) close() {
	// ROLLBACK whatever is open; a connection that cannot be brought back to idle is reported bad, so database/sql
	// closes it instead of pooling a connection inside a transaction.
	_ = s.raw(func(p *pipeSession) error {
		c := p.conn
		if c.IsClosed() {
			return driver.ErrBadConn
		}
		if c.PgConn().TxStatus() != 'I' {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := c.Exec(ctx, "ROLLBACK"); err != nil || c.PgConn().TxStatus() != 'I' {
				return driver.ErrBadConn
			}
		}
		return nil
	})
	_ = s.conn.Close()
}

var errNoDB = errors.New("idempotency: the Guard has no database (New(nil, ...))")
