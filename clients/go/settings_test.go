package idempotency_test

import (
	"context"
	"database/sql"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgx/v4"
)

// settingsBodies are what the handler of TestSessionSettingsChangeNothing answers, by the X-Body header: bytes that
// are not UTF-8 (with a NUL, backslashes and what looks like bytea's escapes), JSON with floats, and text.
var settingsBodies = []struct{ contentType, body string }{
	{"application/octet-stream", "\x00\\x41\\\\\xff\xfe\n\\001"},
	{"application/json", `{"z": 1.5e-7,  "a": "caf\u00e9", "n": 0.1, "big": 123456789.123456789}`},
	{"text/plain; charset=iso-8859-1", "caf\xe9 \\ \"\x01"},
}

// Session settings that change how PostgreSQL writes values as text (bytea_output = 'escape', DateStyle,
// IntervalStyle, a non-UTC TimeZone, extra_float_digits = 0) change nothing the client reads: every replay is the
// first answer byte for byte, over each session kind (prepared statements claim first, BEGIN first with options,
// the simple protocol a pooler gets, NoPipeline, database/sql both ways), and the key expires after Options.TTL.
// (The claim's value was read as record_out's text, its body as bytea's hex: with bytea_output = 'escape' every
// replay answered 500.)
func TestSessionSettingsChangeNothing(t *testing.T) {
	plain := testdb.Pool(t) // skips without a database; reads the keys' expiry under the default settings
	const ttl = 90 * time.Minute
	answer := func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.Header.Get("X-Body"))
		w.Header().Set("Content-Type", settingsBodies[i].contentType)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, settingsBodies[i].body)
	}
	pgxGuard := func(params string) func(opts idempotency.Options) http.Handler {
		return func(opts idempotency.Options) http.Handler {
			pool := testdb.PoolWith(t, params)
			var style string
			if err := pool.QueryRow(context.Background(), `SELECT current_setting('bytea_output') || current_setting('TimeZone')`).Scan(&style); err != nil || style != "escapeAsia/Kolkata" {
				t.Fatalf("the settings did not apply: %q %v", style, err)
			}
			return idempotency.New(pool, opts).HandleTx(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				answer(w, r)
				return nil
			})
		}
	}
	sqlGuard := func(opts idempotency.Options) http.Handler {
		db, err := idempotency.OpenSQL(testdb.URL(t, testdb.HostileSettings))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return idempotency.NewSQL(db, opts).HandleSQL(func(w http.ResponseWriter, r *http.Request, q idempotency.Querier) error {
			if _, ok := q.(*sql.Tx); ok != opts.NoPipeline {
				t.Errorf("the handler got a %T", q)
			}
			answer(w, r)
			return nil
		})
	}
	for _, tc := range []struct {
		name  string
		guard func(opts idempotency.Options) http.Handler
		opts  idempotency.Options
	}{
		{"prepared", pgxGuard(testdb.HostileSettings), idempotency.Options{}},
		{"prepared, BEGIN with options", pgxGuard(testdb.HostileSettings), idempotency.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}}},
		{"simple protocol", pgxGuard(testdb.HostileSettings + "&prefer_simple_protocol=true"), idempotency.Options{}},
		{"NoPipeline", pgxGuard(testdb.HostileSettings), idempotency.Options{NoPipeline: true}},
		{"NoPipeline, simple protocol", pgxGuard(testdb.HostileSettings + "&prefer_simple_protocol=true"), idempotency.Options{NoPipeline: true}},
		{"database/sql", sqlGuard, idempotency.Options{}},
		{"database/sql, NoPipeline", sqlGuard, idempotency.Options{NoPipeline: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scope := testdb.Unique("go_settings_")
			opts := tc.opts
			opts.Scope = func(*http.Request) string { return scope }
			opts.TTL = ttl
			opts.Logger = log.New(io.Discard, "", 0)
			srv := httptest.NewServer(tc.guard(opts))
			defer srv.Close()
			for i, want := range settingsBodies {
				key := testdb.Unique("k")
				hdr := map[string]string{"X-Body": strconv.Itoa(i)}
				first := testdb.Request(t, http.MethodPost, srv.URL+"/s", &key, `{"i": 1}`, hdr)
				again := testdb.Request(t, http.MethodPost, srv.URL+"/s", &key, `{"i": 1}`, hdr)
				if first.Status != 201 || first.Body != want.body || first.Replayed() {
					t.Fatalf("%s: first answer %d %q", want.contentType, first.Status, first.Body)
				}
				if again.Status != 201 || again.Body != want.body || !again.Replayed() ||
					again.Header.Get("Content-Type") != want.contentType {
					t.Errorf("%s: replayed %d %v %q, want %q", want.contentType, again.Status, again.Header, again.Body, want.body)
				}
				var left float64
				if err := plain.QueryRow(context.Background(), `SELECT extract(epoch FROM expires_at - now())::float8
FROM idempotency_keys WHERE key = $1::text AND scope = $2::text`, key, scope).Scan(&left); err != nil {
					t.Fatal(err)
				} else if left < ttl.Seconds()-120 || left > ttl.Seconds() {
					t.Errorf("the key expires in %.0f s, want %.0f", left, ttl.Seconds())
				}
			}
		})
	}
}
