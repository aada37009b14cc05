package idempotency

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v4/pgxpool"
)

// ParsePoolConfig parses a libpq URI or key=value string into a pgxpool configuration that works through PgBouncer
// in transaction pooling mode (1.18 and older keep no prepared statements across transactions):
//
//   - the simple query protocol (PreferSimpleProtocol), so no named server-side prepared statement is created;
//     pgx interpolates the parameters client-side, with standard_conforming_strings on;
//   - no statement cache.
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
