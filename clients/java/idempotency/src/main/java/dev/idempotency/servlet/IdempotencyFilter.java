package dev.idempotency.servlet;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Set;
import java.util.TreeSet;
import java.util.function.BiFunction;
import java.util.function.Function;
import javax.sql.DataSource;
import org.postgresql.PGConnection;
import org.postgresql.PGStatement;
import org.postgresql.util.PGInterval;

/**
 * Idempotency-Key for a Servlet route (clients/CONTRACT.md), over PostgreSQL's {@code idempotency} extension
 * (1.3+) through JDBC (pgjdbc). One request, one transaction on one connection of the {@link DataSource}:
 *
 * <ol>
 *   <li>before anything: the scope (the authenticated caller), the key, the whole body (413 over the limit, nothing
 *       claimed; a body that ends early runs nothing);
 *   <li>{@code BEGIN} with {@code SELECT idem_claim_request(...)} (pgjdbc sends BEGIN with the first statement of a
 *       transaction: one round trip), the body's bytes and Content-Type as they came (rule any-body: never parsed);
 *   <li>{@code replay}, {@code mismatch}, {@code in_progress}, {@code expired}: answered from the claim, rolled back;
 *   <li>{@code claimed}: the rest of the chain runs with the request's {@link Connection} ({@link Idempotency#of},
 *       or {@link #dataSource()}) and its response held back; a 5xx, an exception or a not-executed answer rolls back
 *       (nothing stored, the key released); anything else is stored with {@code idem_complete_request} (the bytes
 *       sent) and committed, then sent. SQLSTATE 40001/40P01 runs the whole transaction again (at most
 *       {@code maxRetries} times).
 * </ol>
 *
 * <p>Statements. The claim and the completion are prepared statements: directly against PostgreSQL, pgjdbc names
 * them on the connection from their first use (prepareThreshold 1) and only binds them afterwards. Behind a pooler in
 * transaction pooling (PgBouncer before 1.21) a named statement may be missing on the server connection (26000), or
 * another client connection's name may be there already (pgjdbc's names, S_1, S_2..., are the same on every
 * connection): so the filter first asks whether the server is behind a pooler (its backend PID is not the one the
 * connection was given, as Go's BehindPooler), and there sends every statement of the request unnamed (pgjdbc's
 * prepareThreshold 0 on the connection, the handler's statements too); a claim that still meets 26000 or 42P05 is
 * rolled back before the handler and run again unnamed, for good.
 *
 * <p>The claim's value is read as text and decoded whatever the session's settings (bytea_output hex or escape:
 * {@link ClaimRecord}); nothing else is read back.
 */
public final class IdempotencyFilter implements Filter {
    static final String CLAIM_SQL = "SELECT idem_claim_request(?, ?, ?, ?, ?, ?, ?, ?)";
    static final String COMPLETE_SQL = "SELECT idem_complete_request(?, ?, ?, ?, ?, ?)";
    /**
     * The completion with COMMIT: pgjdbc sends the two statements of one query text together, before one Sync, so
     * they take one round trip (CONTRACT.md "Round trips"); a failed completion skips the COMMIT (the server skips
     * to the Sync) and the transaction is rolled back.
     */
    static final String COMPLETE_COMMIT_SQL = COMPLETE_SQL + "; COMMIT";
    public static final long DEFAULT_BODY_LIMIT = 1024 * 1024;
    private static final Set<String> RETRYABLE = Set.of("40001", "40P01");
    private static final Set<String> BAD_BODY = Set.of("22P02", "22P05", "22003", "22021");
    private static final Set<String> NOT_PREPARED = Set.of("26000", "42P05");
    /** The answers of the filter's own that the error-shape renderer writes. */
    static final Set<String> OWN_PROBLEMS = Set.of("idempotency-key-missing", "idempotency-key-invalid",
            "idempotency-key-in-progress", "idempotency-key-expired", "request-too-large", "idempotency-key-reused",
            "internal-error", "transaction-conflict", "request-body-unreadable", "request-body-not-json");
    /** Headers never stored for a replay: they describe one connection or one answer. */
    static final Set<String> NOT_REPLAYED = lower(Set.of("Connection", "Keep-Alive", "Transfer-Encoding",
            "Content-Length", "Date", "Server", "Set-Cookie", "Upgrade", "TE", "Trailer", "Proxy-Authenticate",
            "Proxy-Connection", "X-Powered-By", "Idempotent-Replayed", "Idempotency-Key-Expires"));
    private static final System.Logger LOG = System.getLogger(IdempotencyFilter.class.getName());

    /** How the claim and the completion are sent. */
    public enum Prepared {
        /** Named, unless the server is behind a pooler or a claim meets 26000/42P05 (the default). */
        AUTO,
        /** Always named (a direct connection, or a pooler that keeps prepared statements). */
        ALWAYS,
        /** Never named. */
        NEVER
    }

    private final DataSource dataSource;
    private final RequestDataSource requestDataSource;
    private final Function<HttpServletRequest, String> scope;
    private final Duration ttl;
    private final int maxRetries;
    private final Set<String> replayHeaders;
    private final long bodyLimit;
    private final Problem.Renderer renderer;
    private final BiFunction<Integer, String, Answer> errorPage;
    private final List<String> redact;
    private final boolean storeBody;
    private final Prepared prepared;
    private final Set<String> methods;
    private final String problemBase;
    private volatile Boolean pooled;
    private volatile boolean named;

    private IdempotencyFilter(Builder b) {
        dataSource = Objects.requireNonNull(b.dataSource, "dataSource");
        requestDataSource = new RequestDataSource(dataSource);
        scope = b.scope;
        ttl = b.ttl;
        maxRetries = b.maxRetries;
        replayHeaders = b.replayHeaders == null ? null : lower(b.replayHeaders);
        bodyLimit = b.bodyLimit;
        renderer = b.renderer;
        problemBase = b.problemBase;
        errorPage = b.errorPage != null ? b.errorPage
                : (status, message) -> Problem.answer(status, "http-" + status, Problem.reason(status),
                        message == null ? Problem.reason(status) : message);
        redact = List.copyOf(b.redact);
        for (String p : redact) Redaction.tokens(p);
        storeBody = b.storeBody;
        prepared = b.prepared;
        named = prepared != Prepared.NEVER;
        methods = new TreeSet<>(b.methods);
    }

    public static Builder builder(DataSource dataSource) {
        return new Builder(dataSource);
    }

    /** The options of a filter; {@link #build()} checks them. */
    public static final class Builder {
        private final DataSource dataSource;
        private Function<HttpServletRequest, String> scope = r -> "";
        private Duration ttl;
        private int maxRetries = 3;
        private Set<String> replayHeaders;
        private long bodyLimit = DEFAULT_BODY_LIMIT;
        private Problem.Renderer renderer = Problem.PROBLEM_JSON;
        private BiFunction<Integer, String, Answer> errorPage;
        private List<String> redact = List.of();
        private boolean storeBody = true;
        private Prepared prepared = Prepared.AUTO;
        private Set<String> methods = Set.of("POST", "PUT", "PATCH", "DELETE");
        private String problemBase = Problem.BASE;

        private Builder(DataSource dataSource) {
            this.dataSource = dataSource;
        }

        /** The key's scope from the request (the authenticated caller); may throw {@link ProblemException}. */
        public Builder scope(Function<HttpServletRequest, String> scope) {
            this.scope = Objects.requireNonNull(scope);
            return this;
        }

        /** How long a key is kept; null (the default): the server's {@code idempotency.ttl}. */
        public Builder ttl(Duration ttl) {
            this.ttl = ttl;
            return this;
        }

        /** Runs of the whole transaction again after 40001/40P01 (default 3). */
        public Builder maxRetries(int n) {
            if (n < 0) throw new IllegalArgumentException("maxRetries must be >= 0");
            maxRetries = n;
            return this;
        }

        /** The headers a replay answers (besides Content-Type); default: every header but per-connection ones. */
        public Builder replayHeaders(String... names) {
            replayHeaders = Set.of(names);
            return this;
        }

        /** The largest request body in bytes (default 1 MiB, 1048576); over it: 413, nothing claimed. */
        public Builder bodyLimit(long bytes) {
            if (bytes < 0) throw new IllegalArgumentException("bodyLimit must be a byte count");
            bodyLimit = bytes;
            return this;
        }

        /** The error-shape hook: writes the filter's own answers (default: application/problem+json). */
        public Builder renderProblem(Problem.Renderer renderer) {
            this.renderer = Objects.requireNonNull(renderer);
            return this;
        }

        /**
         * The answer of the handler's {@code response.sendError(status, message)} (default: problem+json of type
         * {@code http-<status>}, the reason phrase as title); stored as sent when below 500.
         */
        public Builder errorPage(BiFunction<Integer, String, Answer> page) {
            errorPage = page;
            return this;
        }

        /** JSON Pointers of members dropped from a JSON object body before it is stored (rule store-less). */
        public Builder redact(String... pointers) {
            redact = List.of(pointers);
            return this;
        }

        /** false: store only the status and headers (rule store-less); a replay has an empty body. */
        public Builder storeBody(boolean store) {
            storeBody = store;
            return this;
        }

        public Builder prepared(Prepared p) {
            prepared = Objects.requireNonNull(p);
            return this;
        }

        /** The methods protected (default POST, PUT, PATCH, DELETE); other requests pass through untouched. */
        public Builder methods(String... names) {
            Set<String> s = new TreeSet<>();
            for (String n : names) s.add(n.toUpperCase(Locale.ROOT));
            methods = s;
            return this;
        }

        public Builder problemBase(String base) {
            problemBase = Objects.requireNonNull(base);
            return this;
        }

        public IdempotencyFilter build() {
            return new IdempotencyFilter(this);
        }
    }

    /**
     * The DataSource for the application's code: inside a protected request, {@code getConnection()} is the
     * request's connection (in the claim's transaction); elsewhere, one of the filter's DataSource.
     */
    public DataSource dataSource() {
        return requestDataSource;
    }

    /**
     * {@code req} with {@code body} (its body, read already, e.g. by {@link #readBody}) as its body again: the
     * stream, the reader, and the form's parameters and multipart's parts parsed from it, as the filter hands a
     * protected request to its handler.
     */
    public static HttpServletRequest replaying(HttpServletRequest req, byte[] body) {
        return new ReplayingRequest(req, body);
    }

    private static Set<String> lower(Set<String> names) {
        Set<String> out = new TreeSet<>();
        for (String n : names) out.add(n.toLowerCase(Locale.ROOT));
        return Collections.unmodifiableSet(out);
    }

    // --- the flow

    @Override
    public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        if (!(request instanceof HttpServletRequest req) || !(response instanceof HttpServletResponse res)
                || !methods.contains(req.getMethod().toUpperCase(Locale.ROOT))) {
            chain.doFilter(request, response);
            return;
        }
        Answer answer = execute(req, res, chain);
        if (answer != null) send(res, render(answer));
    }

    /** {@code answer} as the error-shape renderer writes it, when it is one of the filter's own problems. */
    Answer render(Answer answer) {
        return render(answer, renderer);
    }

    static Answer render(Answer answer, Problem.Renderer renderer) {
        Problem p = answer.problem();
        if (p == null || !OWN_PROBLEMS.contains(p.type())) return answer;
        return renderer.render(p);
    }

    /** Writes {@code answer} to the container's response. */
    static void send(HttpServletResponse res, Answer answer) throws IOException {
        if (res.isCommitted()) return;
        res.setStatus(answer.status());
        for (String[] h : answer.headers()) {
            if (h[0].equalsIgnoreCase("Content-Type")) res.setContentType(h[1]);
            else if (!h[0].equalsIgnoreCase("Content-Length")) res.addHeader(h[0], h[1]);
        }
        res.setContentLength(answer.body().length);
        res.getOutputStream().write(answer.body());
    }

    private Answer problem(int status, String type, String title, String detail, String... headers) {
        return problem(problemBase, status, type, title, detail, headers);
    }

    private static Answer problem(String problemBase, int status, String type, String title, String detail,
            String... headers) {
        Map<String, String> h = new LinkedHashMap<>();
        for (int i = 0; i + 1 < headers.length; i += 2) h.put(headers[i], headers[i + 1]);
        return new Problem(status, type, title, detail, h).toAnswer(problemBase);
    }

    Answer internalError(String detail) {
        return problem(500, "internal-error", "Internal Server Error", detail);
    }

    private Answer badBody() {
        return problem(400, "request-body-not-json", "Malformed request body", "the request body is not JSON");
    }

    /** Thrown by {@link #readBody}: the body is over the limit. */
    public static final class TooLarge extends IOException {
        TooLarge() {
            super("request body too large");
        }
    }

    /**
     * The whole body, or TooLarge at once when Content-Length is over the limit (nothing read) or as soon as a
     * chunked body passes it; IOException when the body ends before its Content-Length or the read fails.
     */
    public static byte[] readBody(HttpServletRequest req, long limit) throws IOException {
        long declared = req.getContentLengthLong();
        if (declared > limit) throw new TooLarge();
        ByteArrayOutputStream out = new ByteArrayOutputStream(declared > 0 ? (int) declared : 256);
        byte[] buf = new byte[8192];
        try (InputStream in = req.getInputStream()) {
            int n;
            while ((n = in.read(buf)) >= 0) {
                out.write(buf, 0, n);
                if (out.size() > limit) throw new TooLarge();
            }
        }
        if (declared >= 0 && out.size() != declared) throw new IOException("the body ended before its Content-Length");
        return out.toByteArray();
    }

    private Answer tooLarge() {
        return problem(413, "request-too-large", "Request body too large",
                "the request body is over " + bodyLimit + " bytes", "Connection", "close");
    }

    /** The request's parts as the claim takes them. */
    record Request(String scope, String key, String method, String path, String query, String contentType,
            byte[] body) {}

    /** Everything before the database: an answer to send at once (nothing claimed), or the request. */
    Object admit(HttpServletRequest req) {
        String s;
        try {
            s = scope.apply(req);
        } catch (ProblemException e) {
            return e.answer();
        }
        String key;
        try {
            key = KeyHeader.parse(Collections.list(req.getHeaders("Idempotency-Key")));
        } catch (KeyHeader.KeyException e) {
            return problem(400, e.slug(), e.missing() ? "Idempotency-Key required" : "Invalid Idempotency-Key",
                    e.getMessage());
        }
        byte[] body;
        try {
            body = readBody(req, bodyLimit);
        } catch (TooLarge e) {
            return tooLarge();
        } catch (IOException e) {
            // the client hung up or the read failed: nothing runs from part of a body (rule whole-body)
            return problem(400, "request-body-unreadable", "Unreadable request body",
                    "the request body ended before its Content-Length; nothing was done", "Connection", "close");
        }
        // rule raw-target: the request target as sent (Tomcat and Jetty give getRequestURI() undecoded)
        String query = req.getQueryString();
        return new Request(s == null ? "" : s, key, req.getMethod(), req.getRequestURI(),
                query == null || query.isEmpty() ? null : query, req.getHeader("Content-Type"), body);
    }

    private Answer execute(HttpServletRequest req, HttpServletResponse res, FilterChain chain) throws IOException {
        Object admitted = admit(req);
        if (admitted instanceof Answer a) return a;
        Request r = (Request) admitted;
        Connection conn;
        try {
            conn = dataSource.getConnection();
        } catch (SQLException e) {
            LOG.log(System.Logger.Level.ERROR, "idempotency: cannot connect to the database: " + e.getMessage());
            return internalError("the database is unavailable; retry the request");
        }
        boolean broken = false;
        try {
            learnPooler(conn);
            conn.setAutoCommit(false);
            for (int attempt = 0; ; attempt++) {
                boolean namedNow = named;
                boolean handlerRan = false;
                try {
                    setThreshold(conn, namedNow ? null : 0);
                    ClaimRecord claim;
                    try {
                        claim = claim(conn, r, namedNow);
                    } catch (SQLException e) {
                        if (e.getSQLState() != null && BAD_BODY.contains(e.getSQLState())) {
                            conn.rollback();
                            return badBody();
                        }
                        throw e;
                    }
                    if (!claim.outcome().equals("claimed")) {
                        conn.rollback(); // the claim wrote nothing and holds no lock
                        return answerOf(claim, problemBase);
                    }
                    Connection handed = RequestDataSource.handedOut(conn);
                    Idempotency handle = new Idempotency(handed, r.key(), r.scope(), attempt);
                    ReplayingRequest rq = new ReplayingRequest(req, r.body());
                    rq.setAttribute(Idempotency.ATTRIBUTE, handle);
                    rq.setAttribute(Idempotency.CONNECTION, handed);
                    CapturingResponse rs = new CapturingResponse(res, errorPage);
                    handlerRan = true;
                    RequestDataSource.CURRENT.set(handed);
                    try {
                        chain.doFilter(rq, rs);
                    } finally {
                        RequestDataSource.CURRENT.remove();
                    }
                    Answer captured = rs.answer();
                    if (captured.status() >= 500 || handle.isNotExecuted()) {
                        conn.rollback(); // not stored, the handler's writes undone, the key free again
                        return captured;
                    }
                    complete(conn, r, captured, namedNow); // and COMMIT, in the same round trip
                    conn.commit(); // nothing to send: the transaction is over (pgjdbc saw the server idle)
                    // rule key-lifetime: the claim's headers (Idempotency-Key-Expires) go on the stored answer as
                    // sent, never into the completion
                    Answer sent = captured;
                    for (String[] h : claimHeaders(claim.headers())) sent = sent.withHeader(h[0], h[1]);
                    return sent;
                } catch (Exception e) {
                    try {
                        conn.rollback();
                    } catch (SQLException x) {
                        broken = true;
                    }
                    SQLException sql = sqlException(e);
                    String code = sql == null || sql.getSQLState() == null ? "" : sql.getSQLState();
                    if (!broken && !handlerRan && namedNow && prepared == Prepared.AUTO && NOT_PREPARED.contains(code)) {
                        named = false;
                        LOG.log(System.Logger.Level.INFO, "idempotency: SQLSTATE " + code + " at the claim ("
                                + sql.getMessage() + "): going on with unnamed statements");
                        continue;
                    }
                    if (!broken && RETRYABLE.contains(code)) {
                        if (attempt < maxRetries) continue;
                        return problem(409, "transaction-conflict", "Conflict",
                                "the request kept conflicting with concurrent requests; retry it", "Retry-After", "1");
                    }
                    if (!code.isEmpty()) {
                        LOG.log(System.Logger.Level.ERROR, "idempotency: request rolled back: SQLSTATE " + code + ": "
                                + sql.getMessage());
                    } else {
                        LOG.log(System.Logger.Level.ERROR, "idempotency: request rolled back", e);
                    }
                    return internalError(!code.isEmpty()
                            ? "database error (SQLSTATE " + code + "); the request was rolled back"
                            : "the request failed and was rolled back");
                }
            }
        } catch (SQLException e) {
            broken = true;
            LOG.log(System.Logger.Level.ERROR, "idempotency: " + e.getMessage());
            return internalError("the database is unavailable; retry the request");
        } finally {
            try {
                if (!broken) conn.setAutoCommit(true);
            } catch (SQLException e) {
                // the pool finds it broken
            }
            try {
                conn.close();
            } catch (SQLException e) {
                // nothing left to do
            }
        }
    }

    private static SQLException sqlException(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof SQLException s) return s;
        }
        return null;
    }

    /**
     * Whether {@code conn} (pgjdbc, autocommit) reaches PostgreSQL through a pooler such as PgBouncer: the backend
     * PID the server says is not the one the connection was given at its start (as Go's BehindPooler). A service
     * behind one sets pgjdbc's {@code prepareThreshold=0} so that none of its statements is named.
     */
    public static boolean behindPooler(Connection conn) throws SQLException {
        PGConnection pg = conn.unwrap(PGConnection.class);
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
            rs.next();
            return rs.getInt(1) != pg.getBackendPID();
        }
    }

    /** Once per filter (Prepared.AUTO): is the server behind a pooler? Then no statement is named. */
    private void learnPooler(Connection conn) throws SQLException {
        if (prepared != Prepared.AUTO || pooled != null) return;
        PGConnection pg;
        try {
            pg = conn.unwrap(PGConnection.class);
        } catch (SQLException e) {
            pooled = false;
            return;
        }
        boolean auto = conn.getAutoCommit();
        conn.setAutoCommit(true);
        try (Statement st = conn.createStatement(); ResultSet rs = st.executeQuery("SELECT pg_backend_pid()")) {
            rs.next();
            boolean behind = rs.getInt(1) != pg.getBackendPID();
            pooled = behind;
            if (behind) {
                named = false;
                LOG.log(System.Logger.Level.INFO, "idempotency: behind a pooler: statements are sent unnamed");
            }
        } finally {
            conn.setAutoCommit(auto);
        }
    }

    /** The connection's prepareThreshold: 0 (nothing named, the handler's statements too) behind a pooler. */
    private static void setThreshold(Connection conn, Integer threshold) {
        if (threshold == null) return;
        try {
            conn.unwrap(PGConnection.class).setPrepareThreshold(threshold);
        } catch (SQLException e) {
            // not pgjdbc: its own statement handling
        }
    }

    private static void statementThreshold(PreparedStatement ps, boolean named) {
        try {
            ps.unwrap(PGStatement.class).setPrepareThreshold(named ? 1 : 0);
        } catch (SQLException e) {
            // not pgjdbc
        }
    }

    ClaimRecord claim(Connection conn, Request r, boolean named) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(CLAIM_SQL)) {
            statementThreshold(ps, named);
            ps.setString(1, r.key());
            ps.setString(2, r.scope());
            ps.setString(3, r.method());
            ps.setString(4, r.path());
            ps.setString(5, r.query());
            ps.setString(6, r.contentType());
            ps.setBytes(7, r.body());
            if (ttl == null) {
                ps.setNull(8, Types.OTHER);
            } else {
                // seconds, a form no IntervalStyle changes
                ps.setObject(8, new PGInterval(0, 0, 0, 0, 0, ttl.toMillis() / 1000.0));
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return ClaimRecord.parse(rs.getString(1));
            }
        }
    }

    /** What is stored of {@code kept}'s headers: {content type, JSON object text of the other replayed ones}. */
    static String[] storedHeaders(Answer kept, Set<String> replayHeaders) {
        String contentType = null;
        Map<String, String> headers = new LinkedHashMap<>();
        Map<String, String> names = new LinkedHashMap<>();
        for (String[] h : kept.headers()) {
            String lk = h[0].toLowerCase(Locale.ROOT);
            if (lk.equals("content-type")) {
                if (contentType == null) contentType = h[1];
                continue;
            }
            if (NOT_REPLAYED.contains(lk)) continue;
            if (replayHeaders != null && !replayHeaders.contains(lk) && !Redaction.STORE_LESS.contains(lk)) continue;
            String name = names.computeIfAbsent(lk, k -> h[0]);
            headers.merge(name, h[1], (a, b) -> a + ", " + b);
        }
        return new String[] {contentType, Json.write(headers)};
    }

    private void complete(Connection conn, Request r, Answer captured, boolean named) throws SQLException {
        Answer kept = Redaction.toStore(captured, redact, storeBody);
        String[] stored = storedHeaders(kept, replayHeaders);
        try (PreparedStatement ps = conn.prepareStatement(COMPLETE_COMMIT_SQL)) {
            statementThreshold(ps, named);
            ps.setString(1, r.key());
            ps.setString(2, r.scope());
            ps.setInt(3, kept.status());
            ps.setString(4, stored[0]);
            ps.setObject(5, stored[1], Types.OTHER);
            ps.setBytes(6, storeBody ? kept.body() : null);
            ps.execute();
        }
    }

    /** The answer to a claim that is not {@code claimed}. */
    static Answer answerOf(ClaimRecord c, String base) {
        Answer a = switch (c.outcome()) {
            case "replay" -> replay(c);
            case "mismatch" -> problem(base, c.httpStatus() == null ? 422 : c.httpStatus(), "idempotency-key-reused",
                    "Idempotency-Key reused", "this Idempotency-Key was already used with a different request");
            case "in_progress" -> problem(base, 409, "idempotency-key-in-progress", "Request in progress",
                    "a request with this Idempotency-Key is still being processed; retry later", "Retry-After", "1");
            case "expired" -> problem(base, 410, "idempotency-key-expired", "Idempotency-Key expired",
                    "the response stored for this Idempotency-Key has expired; send the request with a new key");
            default -> throw new IllegalStateException("unknown idem_claim_request outcome " + c.outcome());
        };
        if (!c.outcome().equals("replay") && !c.outcome().equals("expired")) {
            // rule key-lifetime: the key's expiry, among the headers the filter adds (the error-shape hook gets them)
            for (String[] h : claimHeaders(c.headers())) a = a.withHeader(h[0], h[1]);
        }
        return a;
    }

    /**
     * The headers a claim that is not a replay carries for the answer (1.4, rule key-lifetime: the claim's
     * {@code headers} field, {@code {"Idempotency-Key-Expires": "<HTTP-date>"}}; NULL on 1.3).
     */
    static List<String[]> claimHeaders(String json) {
        List<String[]> out = new ArrayList<>();
        if (json == null) return out;
        if (Json.parse(json) instanceof Map<?, ?> m) {
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (e.getValue() instanceof String v) out.add(new String[] {String.valueOf(e.getKey()), v});
            }
        }
        return out;
    }

    private static Answer replay(ClaimRecord c) {
        List<String[]> headers = new ArrayList<>();
        if (c.contentType() != null) headers.add(new String[] {"Content-Type", c.contentType()});
        if (c.headers() != null && Json.parse(c.headers()) instanceof Map<?, ?> m) {
            for (Map.Entry<?, ?> e : m.entrySet()) {
                Object v = e.getValue();
                headers.add(new String[] {String.valueOf(e.getKey()),
                        v instanceof String s ? s : v instanceof Json.Num n ? n.text() : Json.write(v)});
            }
        }
        headers.add(new String[] {"Idempotent-Replayed", "true"});
        return new Answer(c.httpStatus(), headers, c.body() == null ? new byte[0] : c.body());
    }
}
