package idempotency

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v4/pgxpool"
)

// DefaultPoolSize is the pool's size when the URL has no pool_max_conns.
const DefaultPoolSize = 8

// ParsePoolConfig parses a libpq URI or key=value string into a pgxpool configuration that works through PgBouncer
// in transaction pooling mode (1.18 and older keep no prepared statements across transactions):
//
//   - the simple query protocol (PreferSimpleProtocol), so no named server-side prepared statement is created;
//     pgx interpolates the parameters client-side, with standard_conforming_strings on;
//   - no statement cache;
//   - DefaultPoolSize connections (pool_max_conns), all kept open (pool_min_conns = pool_max_conns), unless the
//     URL sets them.
//
// A connection string that says prefer_simple_protocol=false (for a direct connection to PostgreSQL) keeps pgx's
// default, the extended protocol with a statement cache. Nothing here sets session state.
func ParsePoolConfig(connString string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(connString, "prefer_simple_protocol") {
		cfg.ConnConfig.PreferSimpleProtocol = true
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

// NewPool is ParsePoolConfig followed by pgxpool.ConnectConfig.
func NewPool(ctx context.Context, connString string) (*pgxpool.Pool, error) {
	cfg, err := ParsePoolConfig(connString)
	if err != nil {
		return nil, err
	}
	return pgxpool.ConnectConfig(ctx, cfg)
}
