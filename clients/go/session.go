package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgproto3/v2"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// A session is one run of a request's transaction. claim opens the transaction and claims the key; finish stores
// the response and commits; close ends whatever is still open and gives the connection back. A pipelined session
// sends BEGIN with the claim and the completion with COMMIT, so the middleware adds one round trip to the
// handler's own statements where BEGIN, idem_claim, idem_complete, COMMIT one by one would add three (over
// prepared statements, claim first, one more: BEGIN is answered before the handler runs).
type session interface {
	claim(ctx context.Context, args []any) (ClaimRow, error) // idem_claim_request's value
	handlerTx() (pgx.Tx, Querier)                            // the handler's transaction: pgx's, or database/sql's
	finish(ctx context.Context, args []any) error
	close()
}

func (g *Guard) newSession(ctx context.Context) (session, error) {
	if g.sqlDB != nil {
		if g.opts.NoPipeline {
			return &sqlTxSession{db: g.sqlDB, ctx: ctx, opts: g.opts.TxOptions}, nil
		}
		return newSQLPipeSession(ctx, g.sqlDB, beginSQL(g.opts.TxOptions))
	}
	if g.db == nil {
		return nil, errNoDB
	}
	if !g.opts.NoPipeline {
		switch db := g.db.(type) {
		case *pgxpool.Pool:
			pc, err := db.Acquire(ctx)
			if err != nil {
				return nil, err
			}
			return &pipeSession{conn: pc.Conn(), release: pc.Release, begin: beginSQL(g.opts.TxOptions)}, nil
		case *pgx.Conn:
			return &pipeSession{conn: db, release: func() {}, begin: beginSQL(g.opts.TxOptions)}, nil
		}
	}
	return &txSession{db: g.db, ctx: ctx, opts: g.opts.TxOptions}, nil
}

// beginSQL is the BEGIN statement for opts (pgx keeps its own unexported).
func beginSQL(opts pgx.TxOptions) string {
	s := "BEGIN"
	if opts.IsoLevel != "" {
		s += " ISOLATION LEVEL " + string(opts.IsoLevel)
	}
	if opts.AccessMode != "" {
		s += " " + string(opts.AccessMode)
	}
	if opts.DeferrableMode != "" {
		s += " " + string(opts.DeferrableMode)
	}
	return s
}

// txSession runs each statement on its own (DB.BeginTx, claim, ..., complete, Commit): for a DB that is neither a
// *pgxpool.Pool nor a *pgx.Conn, or with Options.NoPipeline.
type txSession struct {
	db   DB
	ctx  context.Context // the request's, for BeginTx (a pool's wait for a connection is not the claim's)
	opts pgx.TxOptions
	t    pgx.Tx
}

func (s *txSession) claim(ctx context.Context, args []any) (c ClaimRow, err error) {
	if s.t, err = s.db.BeginTx(s.ctx, s.opts); err == nil {
		if conn := s.t.Conn(); conn != nil {
			c, err = claimOn(ctx, conn, args)
		} else {
			err = errors.New("idempotency: the DB's transaction has no pgx connection (Tx.Conn() is nil)")
		}
	}
	return c, err
}

// claimOn sends the claim alone in the transaction open on conn: prepared, with its result in binary; under the
// simple protocol (a pooler), unprepared, its text decoded.
func claimOn(ctx context.Context, conn *pgx.Conn, args []any) (ClaimRow, error) {
	if conn.Config().PreferSimpleProtocol {
		var text string
		if err := conn.QueryRow(ctx, claimSQL, args...).Scan(&text); err != nil {
			return ClaimRow{}, err
		}
		return decodeClaimText(text)
	}
	if _, err := conn.Prepare(ctx, claimSQL, claimSQL); err != nil {
		return ClaimRow{}, err
	}
	values, formats := bindArgs(args)
	res := conn.PgConn().ExecPrepared(ctx, claimSQL, values, formats, binaryResult).Read()
	if res.Err != nil {
		return ClaimRow{}, res.Err
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return ClaimRow{}, fmt.Errorf("idempotency: idem_claim_request answered %d rows", len(res.Rows))
	}
	return decodeClaim(res.Rows[0][0])
}

// binaryResult asks for the claim's one column in binary: the composite's binary form, which no session setting
// (bytea_output, DateStyle, IntervalStyle, extra_float_digits) changes.
var binaryResult = []int16{1}

// bindArgs are the claim's parameters as Bind sends them: text, the body (bytea) in binary, nil as NULL.
func bindArgs(args []any) (values [][]byte, formats []int16) {
	values, formats = make([][]byte, len(args)), make([]int16, len(args))
	for i, a := range args {
		switch a := a.(type) {
		case string:
			values[i] = append([]byte{}, a...) // text, never NULL
		case []byte:
			values[i], formats[i] = a, 1 // bytea, binary
		}
	}
	return values, formats
}

func (s *txSession) handlerTx() (pgx.Tx, Querier) { return s.t, nil }

func (s *txSession) finish(ctx context.Context, args []any) error {
	if err := s.t.QueryRow(ctx, completeSQL, args...).Scan(new(bool)); err != nil {
		return err
	}
	return s.t.Commit(ctx)
}

func (s *txSession) close() {
	if s.t != nil {
		rollback(s.t) // after a COMMIT this does nothing
	}
}

// pipeSession holds one connection for the request and sends the claim with BEGIN (claim), and complete + COMMIT
// as one batch. With the simple protocol (ParsePoolConfig) pgx sends a batch as one Query message of several
// statements; with the extended protocol, as one pipeline ending in a single Sync. Either way a failing statement
// stops the rest of the batch, so a COMMIT never follows a failed completion.
type pipeSession struct {
	conn       *pgx.Conn
	release    func()
	begin      string
	beginFirst bool // BEGIN with the claim, answered before the handler runs (database/sql)
	t          *connTx
}

func (s *pipeSession) claim(ctx context.Context, args []any) (ClaimRow, error) {
	if s.conn.Config().PreferSimpleProtocol {
		// BEGIN and the claim as one Query message of both statements (what a pooler lets through); the claim's
		// value comes as text.
		b := &pgx.Batch{}
		b.Queue(s.begin)
		b.Queue(claimSQL, args...)
		br := s.conn.SendBatch(ctx, b)
		_, err := br.Exec()
		var text string
		if err == nil {
			s.t = &connTx{conn: s.conn}
			err = br.QueryRow().Scan(&text)
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return ClaimRow{}, err
		}
		return decodeClaimText(text)
	}
	pc := s.conn.PgConn()
	// Prepared once per connection, each named by its text, so that pgx's Exec of ROLLBACK (close, connTx.Rollback)
	// runs the prepared statement too.
	for _, sql := range []string{s.begin, claimSQL, "ROLLBACK"} {
		if _, err := s.conn.Prepare(ctx, sql, sql); err != nil {
			return ClaimRow{}, err
		}
	}
	values, formats := bindArgs(args)
	claim := &pgproto3.Bind{PreparedStatement: claimSQL, ParameterFormatCodes: formats, Parameters: values,
		ResultFormatCodes: binaryResult}
	if s.beginFirst || s.begin != "BEGIN" {
		// BEGIN first, with the claim, in one round trip ending in Sync: for a BEGIN with options (an isolation
		// level is set before any statement of the transaction); for database/sql (its statements bypass connTx).
		buf := (&pgproto3.Execute{}).Encode((&pgproto3.Bind{PreparedStatement: s.begin}).Encode(nil))
		buf = (&pgproto3.Sync{}).Encode((&pgproto3.Execute{}).Encode(claim.Encode(buf)))
		if err := pc.SendBytes(ctx, buf); err != nil {
			return ClaimRow{}, err
		}
		value, err := receive(ctx, pc, true)
		if err == nil && pc.TxStatus() == 'T' {
			s.t = &connTx{conn: s.conn}
		} else if err == nil {
			err = fmt.Errorf("idempotency: BEGIN left the connection in state %q", pc.TxStatus())
		}
		if err != nil {
			return ClaimRow{}, err
		}
		return decodeClaim(value)
	}
	// The claim goes first, alone, then Flush: it runs in the transaction the extended protocol opens for it, which
	// the next Sync ends. A claimed key: BEGIN and Sync follow, and BEGIN makes that transaction the request's, the
	// claim in it; their answers are read before the handler runs, so a BEGIN that failed (the backend gone) is
	// seen before the handler starts anything. Any other outcome (replay, mismatch, in progress): Sync alone ends
	// the transaction, in which the claim wrote nothing, with no BEGIN nor ROLLBACK to run. Until that Sync the
	// server arms no timeout (idle_in_transaction_session_timeout counts from a ReadyForQuery): ctx's deadline
	// (Options.ClaimTimeout) bounds the exchange, and a connection it cuts off is closed, which ends the claim's
	// transaction and frees the key.
	value, err := []byte(nil), pc.SendBytes(ctx, (&pgproto3.Flush{}).Encode((&pgproto3.Execute{}).Encode(claim.Encode(nil))))
	if err == nil {
		value, err = receive(ctx, pc, false)
	}
	if pgErr := (*pgconn.PgError)(nil); err != nil && !errors.As(err, &pgErr) {
		return ClaimRow{}, broken(pc, err) // nothing sent, or the connection closed
	}
	end := (&pgproto3.Sync{}).Encode(nil)
	var c ClaimRow
	if err == nil {
		c, err = decodeClaim(value)
	}
	claimed := err == nil && c.Outcome == OutcomeClaimed
	if claimed {
		end = (&pgproto3.Sync{}).Encode((&pgproto3.Execute{}).Encode((&pgproto3.Bind{PreparedStatement: s.begin}).Encode(nil)))
	}
	if serr := pc.SendBytes(ctx, end); serr != nil {
		return ClaimRow{}, broken(pc, serr) // the claim's transaction would wait for a Sync that does not come
	}
	if _, serr := receive(ctx, pc, true); err == nil {
		err = serr
	}
	if claimed && err == nil {
		if pc.TxStatus() != 'T' {
			return ClaimRow{}, broken(pc, fmt.Errorf("idempotency: BEGIN after the claim left the connection in state %q", pc.TxStatus()))
		}
		s.t = &connTx{conn: s.conn}
	}
	return c, err
}

// broken closes a connection whose exchange stopped midway (an answer half read, a Sync not sent): it cannot be used
// again, and the pool drops a closed connection when it is released.
func broken(pc *pgconn.PgConn, err error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = pc.Close(ctx)
	cancel()
	return err
}

// receive reads answers up to the first CommandComplete or ErrorResponse (toSync false: what was sent ends in
// Flush) or to ReadyForQuery (toSync true: it ends in Sync). It returns the first column of the last data row and
// the first error; a connection it could not read to the end is closed.
func receive(ctx context.Context, pc *pgconn.PgConn, toSync bool) (value []byte, err error) {
	for {
		msg, rerr := pc.ReceiveMessage(ctx)
		if rerr != nil {
			return nil, broken(pc, rerr)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			if len(m.Values) == 1 {
				value = append([]byte(nil), m.Values[0]...) // the message's buffer is reused
			}
		case *pgproto3.ErrorResponse:
			if err == nil {
				err = pgconn.ErrorResponseToPgError(m)
			}
		case *pgproto3.ReadyForQuery:
			return value, err
		}
		if _, complete := msg.(*pgproto3.CommandComplete); !toSync && (complete || err != nil) {
			return value, err
		}
	}
}

func (s *pipeSession) handlerTx() (pgx.Tx, Querier) { return s.t, nil } // s.t: set once claim began the transaction

func (s *pipeSession) finish(ctx context.Context, args []any) error {
	if err := s.t.ready(ctx); errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("idempotency: the handler ended the request's transaction: %w", err)
	} else if err != nil {
		return err
	}
	b := &pgx.Batch{}
	b.Queue(completeSQL, args...)
	b.Queue("COMMIT")
	br := s.conn.SendBatch(ctx, b)
	err := br.QueryRow().Scan(new(bool))
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && string(tag) != "COMMIT" {
			err = fmt.Errorf("idempotency: COMMIT answered %q: %w", tag, pgx.ErrTxCommitRollback)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		s.t.closed = true
	}
	return err
}

func (s *pipeSession) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if s.t != nil {
		s.t.closed = true
	}
	if s.conn.PgConn().TxStatus() != 'I' && !s.conn.IsClosed() {
		_, err := s.conn.Exec(ctx, "ROLLBACK")
		if err != nil {
			// The pool destroys a connection released in a transaction; closing it says so plainly.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.conn.Close(ctx)
			cancel()
		}
	}
	s.release()
}

// errHandlerCommit: the middleware, not the handler, commits the request's transaction (after storing the
// response in it).
var errHandlerCommit = errors.New("idempotency: the request's transaction is committed by the middleware, not the handler")

// connTx is the pgx.Tx a handler gets in a pipelined session: the statements go to the session's connection,
// inside the transaction the middleware began. Begin and BeginFunc make savepoints. Commit is refused (the
// middleware commits); Rollback rolls the whole transaction back, and the request then fails with 500.
// LargeObjects is not available (pgx gives no way to make one for a transaction it did not begin): set
// Options.NoPipeline for a handler that needs it.
type connTx struct {
	conn       *pgx.Conn
	closed     bool
	savepoints int
}

// ready reports whether the transaction is still usable (ctx: kept for the callers' symmetry).
func (t *connTx) ready(context.Context) error {
	if t.closed {
		return pgx.ErrTxClosed
	}
	return nil
}

var _ pgx.Tx = (*connTx)(nil)

func (t *connTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	t.savepoints++
	name := fmt.Sprintf("idem_sp_%d", t.savepoints)
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepointTx{connTx: t, name: name}, nil
}

func (t *connTx) BeginFunc(ctx context.Context, f func(pgx.Tx) error) error {
	return beginFunc(ctx, t, f)
}

func beginFunc(ctx context.Context, parent pgx.Tx, f func(pgx.Tx) error) error {
	sp, err := parent.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(sp); err != nil {
		_ = sp.Rollback(ctx)
		return err
	}
	return sp.Commit(ctx)
}

func (t *connTx) Commit(ctx context.Context) error {
	if err := t.ready(ctx); err != nil {
		return err
	}
	return errHandlerCommit
}

func (t *connTx) Rollback(ctx context.Context) error {
	if err := t.ready(ctx); err != nil {
		return err
	}
	t.closed = true
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	return err
}

func (t *connTx) CopyFrom(ctx context.Context, table pgx.Identifier, cols []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.ready(ctx); err != nil {
		return 0, err
	}
	return t.conn.CopyFrom(ctx, table, cols, src)
}

func (t *connTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := t.ready(ctx); err != nil {
		return errBatch{err}
	}
	return t.conn.SendBatch(ctx, b)
}

func (t *connTx) LargeObjects() pgx.LargeObjects {
	panic("idempotency: LargeObjects is not available on a pipelined request transaction; set Options.NoPipeline")
}

func (t *connTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.conn.Prepare(ctx, name, sql)
}

func (t *connTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

func (t *connTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

func (t *connTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := t.ready(ctx); err != nil {
		return errRow{err}
	}
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *connTx) QueryFunc(ctx context.Context, sql string, args []any, scans []any, f func(pgx.QueryFuncRow) error) (pgconn.CommandTag, error) {
	if err := t.ready(ctx); err != nil {
		return nil, err
	}
	return t.conn.QueryFunc(ctx, sql, args, scans, f)
}

func (t *connTx) Conn() *pgx.Conn {
	return t.conn
}

// savepointTx is a pseudo-nested transaction of a connTx.
type savepointTx struct {
	*connTx
	name  string
	ended bool
}

func (s *savepointTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.ended {
		return nil, pgx.ErrTxClosed
	}
	return s.connTx.Begin(ctx)
}

func (s *savepointTx) BeginFunc(ctx context.Context, f func(pgx.Tx) error) error {
	return beginFunc(ctx, s, f)
}

func (s *savepointTx) Commit(ctx context.Context) error { return s.end(ctx, "RELEASE SAVEPOINT ") }

func (s *savepointTx) Rollback(ctx context.Context) error {
	return s.end(ctx, "ROLLBACK TO SAVEPOINT ")
}

// end releases the savepoint or rolls back to it, once.
func (s *savepointTx) end(ctx context.Context, sql string) error {
	if s.ended || s.connTx.closed {
		return pgx.ErrTxClosed
	}
	s.ended = true
	_, err := s.conn.Exec(ctx, sql+s.name)
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return nil, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return errRow(b) }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) QueryFunc(scans []any, f func(pgx.QueryFuncRow) error) (pgconn.CommandTag, error) {
	return nil, b.err
}
