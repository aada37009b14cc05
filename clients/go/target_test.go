package idempotency_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	idempotency "github.com/idempotency-pg/idempotency/clients/go"
	"github.com/idempotency-pg/idempotency/clients/go/internal/testdb"
	"github.com/jackc/pgx/v4"
)

// RequestTarget is the request line's target split at its first '?', undecoded, as the Node.js client takes it
// (req.originalUrl split at '?'): %2F, %20, %41 kept, a trailing '?' an empty query, a second '?' part of the
// query, an absolute-form target as sent; a request made in process gives its URL's escaped form. (The guard
// fingerprinted r.URL.Path, decoded: /files/a%2Fb was /files/a/b.)
func TestRequestTarget(t *testing.T) {
	got := make(chan [2]string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, q := idempotency.RequestTarget(r)
		got <- [2]string{p, q}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	for _, tc := range []struct{ target, path, query string }{
		{"/files/a%2Fb", "/files/a%2Fb", ""},
		{"/files/a/b", "/files/a/b", ""},
		{"/files/%41", "/files/%41", ""},
		{"/files/a%20b?x=%20", "/files/a%20b", "x=%20"},
		{"/files/x?", "/files/x", ""},
		{"/files/x?a?b=c", "/files/x", "a?b=c"},
		{"/files/./x/../y", "/files/./x/../y", ""},
		{"http://example.com/files/x?q=1", "http://example.com/files/x", "q=1"},
	} {
		testdb.RawPost(t, srv.URL, tc.target, "k", `{}`)
		if g := <-got; g != [2]string{tc.path, tc.query} {
			t.Errorf("%s: path %q, query %q; want %q, %q", tc.target, g[0], g[1], tc.path, tc.query)
		}
	}
	r, _ := http.NewRequest(http.MethodPost, "http://h/files/a%2Fb?x=%41", nil)
	if p, q := idempotency.RequestTarget(r); p != "/files/a%2Fb" || q != "x=%41" {
		t.Errorf("in process: %q %q", p, q)
	}
}

// One request line, one fingerprint, through net/http and chi: a key reused on /files/a/b after /files/a%2Fb (or
// on /files/A after /files/%41) is another request, 422, not the other resource's replay; /files/x? and /files/x
// are one request.
func TestOneRequestLineOneFingerprint(t *testing.T) {
	pool := testdb.Pool(t)
	var n atomic.Int32
	h := func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"n": %d}`, n.Add(1))
	}
	scope := testdb.Unique("go_target_")
	opts := idempotency.Options{Scope: func(*http.Request) string { return scope }}
	g := idempotency.New(pool, opts)
	mux := http.NewServeMux()
	mux.Handle("/files/", g.HandleTx(func(w http.ResponseWriter, r *http.Request, _ pgx.Tx) error {
		h(w, r)
		return nil
	}))
	router := chi.NewRouter()
	router.With(g.Middleware).Post("/files/*", h)
	for name, handler := range map[string]http.Handler{"net/http": mux, "chi": router} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(handler)
			defer srv.Close()
			testdb.CheckRequestLines(t, srv.URL)
		})
	}
}
