package idempotency

import "testing"

func TestParsePoolConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		url      string
		max, min int32
		simple   bool
	}{
		{"postgresql://u@127.0.0.1/db", DefaultPoolSize, DefaultPoolSize, false},
		{"postgresql://u@127.0.0.1/db?pool_max_conns=3", 3, 3, false},
		{"postgresql://u@127.0.0.1/db?pool_min_conns=1", DefaultPoolSize, 1, false},
		{"postgresql://u@127.0.0.1/db?prefer_simple_protocol=true", DefaultPoolSize, DefaultPoolSize, true},
	} {
		cfg, err := ParsePoolConfig(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.MaxConns != tc.max || cfg.MinConns != tc.min || cfg.ConnConfig.PreferSimpleProtocol != tc.simple ||
			(cfg.ConnConfig.BuildStatementCache == nil) != tc.simple {
			t.Errorf("%s: max %d min %d simple %v; want %d %d %v", tc.url, cfg.MaxConns, cfg.MinConns,
				cfg.ConnConfig.PreferSimpleProtocol, tc.max, tc.min, tc.simple)
		}
	}
}
