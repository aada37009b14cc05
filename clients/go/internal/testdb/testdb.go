// Package testdb opens the database of the integration tests, named by IDEM_TEST_DATABASE_URL (a database with
// CREATE EXTENSION idempotency and clients/schema.sql loaded). Without the variable the tests are skipped.
package testdb

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/jackc/pgx/v4"
	"github.com/jackc/pgx/v4/pgxpool"
)

// Env names the database URL.
const Env = "IDEM_TEST_DATABASE_URL"

// Pool connects (simple protocol, as the service does) or skips t when Env is unset. The pool is closed when t
// ends. It fails t when the database lacks the extension or the ledger table.
func Pool(t testing.TB) *pgxpool.Pool { return PoolWith(t, "") }

// HostileSettings are session settings that change how PostgreSQL writes values as text (bytea, timestamps,
// intervals, floats), as URL parameters (pgx sends them at startup): nothing the clients read may depend on them.
const HostileSettings = "bytea_output=escape&DateStyle=SQL%2C%20DMY&IntervalStyle=sql_standard&TimeZone=Asia%2FKolkata&extra_float_digits=0"

// URL is Env's URL with the URL parameters params added (none when ""); it skips t when Env is unset.
func URL(t testing.TB, params string) string {
	t.Helper()
	url := os.Getenv(Env)
	if url == "" {
		t.Skip(Env + " is not set: skipping the database test")
	}
	if params == "" {
		return url
	}
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + params
}

// PoolWith is Pool with the URL parameters params (settings such as HostileSettings, prefer_simple_protocol).
func PoolWith(t testing.TB, params string) *pgxpool.Pool {
	t.Helper()
	url := URL(t, params)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// One connection kept open, not NewPool's eight: the tests open many short-lived pools.
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, err := idempotency.NewPool(ctx, url+sep+"pool_min_conns=1")
	if err != nil {
		t.Fatalf("connect %s: %v", Env, err)
	}
	t.Cleanup(pool.Close)
	var ok bool
	err = pool.QueryRow(ctx, `SELECT to_regproc('idem_claim') IS NOT NULL AND to_regclass('ledger') IS NOT NULL`).Scan(&ok)
	if err != nil || !ok {
		t.Fatalf("the test database needs CREATE EXTENSION idempotency and clients/schema.sql (%v)", err)
	}
	return pool
}

// Unique is a fresh name with prefix, for accounts, scopes and keys that no other run uses.
func Unique(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// LedgerRows counts the ledger rows of account.
func LedgerRows(t testing.TB, pool *pgxpool.Pool, account string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM ledger WHERE account = $1::text`, account).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Result is an HTTP answer read whole.
type Result struct {
	Status int
	Header http.Header
	Body   string
}

// Replayed reports whether the answer carries Idempotent-Replayed: true.
func (r Result) Replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// ProblemType is the type of an application/problem+json answer without idempotency.DefaultProblemBase, or
// "(not a problem)" when r is not one or its document's status is not the status of the answer.
func (r Result) ProblemType() string {
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	_ = json.Unmarshal([]byte(r.Body), &p)
	if p.Status != r.Status || r.Header.Get("Content-Type") != "application/problem+json" {
		return "(not a problem)"
	}
	return strings.TrimPrefix(p.Type, idempotency.DefaultProblemBase)
}

// Ptr is a key for Request: nil sends no Idempotency-Key, Ptr("") an empty one.
func Ptr(s string) *string { return &s }

// Request sends method to url with the Idempotency-Key *key (none when key is nil) and the headers hdr; any
// method but GET and HEAD says its body is JSON.
func Request(t testing.TB, method, url string, key *string, body string, hdr map[string]string) Result {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if method != http.MethodGet && method != http.MethodHead {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != nil {
		req.Header.Set("Idempotency-Key", *key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Result{resp.StatusCode, resp.Header, string(b)}
}

// Post sends a JSON body to url with the Idempotency-Key key ("" sends none).
func Post(t testing.TB, url, key, body string) Result {
	t.Helper()
	var k *string
	if key != "" {
		k = &key
	}
	return Request(t, http.MethodPost, url, k, body, nil)
}

// App is the state of a framework adapter's test server: a fresh account, the only scope of its requests, whose
// ledger its handler debits, and the number of handler runs.
type App struct {
	T       *testing.T
	Pool    *pgxpool.Pool
	Account string
	Runs    atomic.Int32
	Srv     *httptest.Server
}

// NewApp connects (or skips t, as Pool) and names a fresh account starting with prefix.
func NewApp(t *testing.T, prefix string) *App {
	return &App{T: t, Pool: Pool(t), Account: Unique(prefix)}
}

// Options scope every request to the account and discard the middleware's log.
func (a *App) Options() idempotency.Options {
	return idempotency.Options{Scope: func(*http.Request) string { return a.Account }, Logger: log.New(io.Discard, "", 0)}
}

// Serve starts the test server on h, closed when the test ends.
func (a *App) Serve(h http.Handler) {
	a.Srv = httptest.NewServer(h)
	a.T.Cleanup(a.Srv.Close)
}

// Post sends POST /p with the key and a small JSON body.
func (a *App) Post(key string) Result {
	a.T.Helper()
	return Post(a.T, a.Srv.URL+"/p", key, `{"amount_cents": 100}`)
}

// RowsAre checks the number of ledger rows of the account.
func (a *App) RowsAre(want int) {
	a.T.Helper()
	if n := LedgerRows(a.T, a.Pool, a.Account); n != want {
		a.T.Fatalf("%d ledger rows, want %d", n, want)
	}
}

// Debit inserts a ledger row for account in tx, as the payment handler does.
func Debit(ctx context.Context, tx pgx.Tx, account, key string) error {
	_, err := tx.Exec(ctx, `INSERT INTO ledger (account, amount_cents, currency, idempotency_key)
VALUES ($1::text, -100, 'USD', $2::text)`, account, key)
	return err
}

// SerializationFailure is the statement that fails with SQLSTATE 40001, as a conflict between transactions does.
const SerializationFailure = `DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$`

// CreatedOnceAfterConflict posts one key twice to a handler that fails its first run with SerializationFailure
// and answers 201 with Location /p/1 on the second: the first answer is that 201, the second its replay, byte for
// byte, the handler ran twice (the conflict, then the success) and the account has one ledger row.
func (a *App) CreatedOnceAfterConflict() {
	a.T.Helper()
	key := Unique("k")
	first := a.Post(key)
	second := a.Post(key)
	if first.Status != 201 || second.Status != 201 || !second.Replayed() || second.Body != first.Body ||
		second.Header.Get("Location") != "/p/1" {
		a.T.Fatalf("first %+v second %+v", first, second)
	}
	if a.Runs.Load() != 2 {
		a.T.Fatalf("runs %d, want 2 (the conflict, then the success)", a.Runs.Load())
	}
	a.RowsAre(1)
}

// Proxy is a TCP proxy in front of the test database, for what a server cannot be made to do: Hold stops passing the
// server's answers to the client (a network that stalls), CutAtSync closes both sides, unforwarded, at the client's
// next bytes that do not end with a Flush message (the Sync that ends the exchange: as if the backend died there).
type Proxy struct {
	Addr      string // host:port to connect to
	Hold      atomic.Bool
	CutAtSync atomic.Bool
	ln        net.Listener
	target    string
}

// NewProxy listens on a free loopback port and passes every connection on to Env's server; it stops when t ends.
func NewProxy(t testing.TB) *Proxy {
	t.Helper()
	cfg, err := pgx.ParseConfig(URL(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	t.Cleanup(func() { _ = ln.Close(); p.Hold.Store(false) })
	go p.serve()
	return p
}

// URL is Env's URL with the URL parameters params added (as URL does) and the proxy's address in place of the
// server's.
func (p *Proxy) URL(t testing.TB, params string) string {
	u, err := neturl.Parse(URL(t, params))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.Addr
	return u.String()
}

var flushMessage = []byte{'H', 0, 0, 0, 4}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		closeBoth := func() { _ = c.Close(); _ = s.Close() }
		go func() { // client -> server
			defer closeBoth()
			buf := make([]byte, 1<<16)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if p.CutAtSync.Load() && !bytes.HasSuffix(buf[:n], flushMessage) {
					return
				}
				if _, err := s.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
		go func() { // server -> client
			defer closeBoth()
			buf := make([]byte, 1<<16)
			for {
				n, err := s.Read(buf)
				if err != nil {
					return
				}
				for p.Hold.Load() {
					time.Sleep(5 * time.Millisecond)
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}

// RawPost sends POST target (written into the request line exactly as given) to the server at base with the
// Idempotency-Key key and a JSON body, over a connection of its own.
func RawPost(t testing.TB, base, target, key, body string) Result {
	t.Helper()
	u, err := neturl.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nIdempotency-Key: %s\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\nConnection: close\r\n\r\n%s", target, u.Host, key, len(body), body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return Result{resp.StatusCode, resp.Header, string(b)}
}

// RequestLines are pairs of request targets a client sends with one key, and whether the second is the same
// request (a replay) or another one (a mismatch): the fingerprint takes the request line's path as sent, undecoded.
var RequestLines = []struct {
	First, Second string
	Same          bool
}{
	{"/files/a%2Fb", "/files/a/b", false},
	{"/files/%41", "/files/A", false},
	{"/files/a%20b", "/files/a%2520b", false},
	{"/files/x?", "/files/x", true},
	{"/files/x?a=%41", "/files/x?a=A", false},
	{"/files/x?a=1", "/files/x?a=1", true},
}

// CheckRequestLines sends each pair of RequestLines to base (a server that answers 201 on any path under /files/,
// guarded) with one fresh key: the second answer is the first's replay or a mismatch (422), as the pair says.
func CheckRequestLines(t *testing.T, base string) {
	t.Helper()
	for _, rl := range RequestLines {
		key := Unique("k")
		first := RawPost(t, base, rl.First, key, `{}`)
		second := RawPost(t, base, rl.Second, key, `{}`)
		if first.Status != 201 {
			t.Errorf("%s: %d %q", rl.First, first.Status, first.Body)
		} else if rl.Same && (!second.Replayed() || second.Body != first.Body) {
			t.Errorf("%s then %s: %d %q, want the replay", rl.First, rl.Second, second.Status, second.Body)
		} else if !rl.Same && second.ProblemType() != "idempotency-key-reused" {
			t.Errorf("%s then %s: %d %q, want 422 idempotency-key-reused", rl.First, rl.Second, second.Status, second.Body)
		}
	}
}
