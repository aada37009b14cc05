package idempotency

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// DefaultPoolSize is the pool's size when the URL has no pool_max_conns.
const DefaultPoolSize = 8

// ParsePoolConfig parses a libpq URI or key=value string into a pgxpool configuration:
//
//   - pgx's extended protocol with its statement cache (its default): each statement is prepared once per
//     connection, then sent as Bind and Execute only, and a batch is one pipeline;
//   - with prefer_simple_protocol=true in the string, the simple protocol and no statement cache, for PgBouncer in
//     transaction pooling mode (1.18 and older keep no prepared statement across transactions): pgx interpolates
//     the parameters client-side, with standard_conforming_strings on, and the server parses and plans each
//     statement every time (NewPool chooses this by itself behind a pooler);
//   - DefaultPoolSize connections (pool_max_conns), all kept open (pool_min_conns = pool_max_conns), unless the
//     string sets them.
//
// Nothing here sets session state.
func ParsePoolConfig(connString string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if cfg.ConnConfig.PreferSimpleProtocol {
		cfg.ConnConfig.BuildStatementCache = nil
	}
	// A claimed request holds a connection for its whole transaction, and a duplicate must get its 409 at once:
	// opening a connection (a new backend) on demand can take longer than the answer itself on a busy server.
	// So unless the URL says otherwise the pool is DefaultPoolSize connections, all kept open.
	if !strings.Contains(connString, "pool_max_conns") {
		cfg.MaxConns = DefaultPoolSize
	}
	if !strings.Contains(connString, "pool_min_conns") {
		cfg.MinConns = cfg.MaxConns
	}
	return cfg, nil
}

// NewPool is ParsePoolConfig followed by pgxpool.ConnectConfig. Unless the string sets prefer_simple_protocol, it
// first connects once to see whether the server is behind a pooler (BehindPooler), and there uses the simple
// protocol.
func NewPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := ParsePoolConfig(connString)
	if err != nil {
		return nil, err
	}
	if err := chooseProtocol(ctx, cfg.ConnConfig, connString); err != nil {
		return nil, err
	}
	return pgxpool.ConnectConfig(ctx, cfg)
}

func chooseProtocol(ctx context.Context, cfg *pgx.ConnConfig, connString string) error {
	if strings.Contains(connString, "prefer_simple_protocol") {
		return nil
	}
	pooled, err := BehindPooler(ctx, cfg)
	if pooled {
		cfg.PreferSimpleProtocol, cfg.BuildStatementCache = true, nil
	}
	return err
}

// BehindPooler connects once (with the simple protocol, so no statement is left prepared) and reports whether
// the connection reaches PostgreSQL through a pooler such as PgBouncer: the backend process id PostgreSQL gives a
// client at startup is the backend that then runs its statements; a pooler gives its own, made-up one.
func BehindPooler(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	probe := cfg.Copy()
	probe.PreferSimpleProtocol, probe.BuildStatementCache = true, nil
	c, err := pgx.ConnectConfig(ctx, probe)
	if err != nil {
		return false, err
	}
	defer c.Close(context.Background())
	res, err := c.PgConn().Exec(ctx, "SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return false, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return false, nil
	}
	return string(res[0].Rows[0][0]) != strconv.FormatUint(uint64(c.PgConn().PID()), 10), nil
}
