package dev.idempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import javax.sql.DataSource;
import org.apache.catalina.Context;
import org.apache.catalina.connector.Connector;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/**
 * The filter in an embedded Tomcat over HTTP, against IDEM_TEST_DATABASE_URL (a database with the extension and
 * clients/schema.sql; skipped without it), every connection under settings another role could choose
 * (bytea_output = escape, DateStyle, IntervalStyle, TimeZone, extra_float_digits: rule session-settings).
 */
class FilterTest {
    private static Tomcat tomcat;
    private static int port;
    private static DataSource db;
    private static final HttpClient HTTP = HttpClient.newHttpClient();

    /** The handler: POST /<route>: a ledger row on the request's connection, then an answer the query asks for. */
    static final class Handler extends HttpServlet {
        private final IdempotencyFilter filter;

        Handler(IdempotencyFilter filter) {
            this.filter = filter;
        }

        @Override
        protected void doPost(HttpServletRequest req, HttpServletResponse res) throws java.io.IOException {
            Idempotency idem = Idempotency.of(req);
            String want = req.getParameter("answer") == null ? "" : req.getParameter("answer");
            try {
                if (want.equals("invalid")) {
                    idem.notExecuted();
                    res.setStatus(422);
                    res.setContentType("application/json");
                    res.getOutputStream().write("{\"error\":\"invalid\"}".getBytes(StandardCharsets.UTF_8));
                    return;
                }
                Connection c = idem.connection();
                long id;
                try (PreparedStatement ps = c.prepareStatement("INSERT INTO ledger (account, amount_cents, currency, "
                        + "idempotency_key) VALUES (?, -1, 'EUR', ?) RETURNING id")) {
                    ps.setString(1, idem.scope());
                    ps.setString(2, idem.key());
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        id = rs.getLong(1);
                    }
                }
                // the same connection (and transaction) through the filter's DataSource
                long[] backend = new long[2];
                try (Connection same = filter.dataSource().getConnection();
                        PreparedStatement ps = same.prepareStatement("SELECT txid_current(), pg_backend_pid()");
                        ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    backend[0] = rs.getLong(1);
                }
                long txid;
                try (PreparedStatement ps = c.prepareStatement("SELECT txid_current()"); ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    txid = rs.getLong(1);
                }
                if (want.equals("503")) {
                    res.sendError(503, "upstream unavailable");
                    return;
                }
                if (want.equals("throw")) throw new IllegalStateException("the handler failed");
                res.setStatus(201);
                res.setContentType("application/json");
                res.setHeader("Location", "/things/" + id);
                String form = req.getParameter("amount");
                res.getOutputStream().write(("{\"id\": " + id + ", \"same_tx\": " + (backend[0] == txid)
                        + ", \"amount\": " + (form == null ? "null" : Json.quote(form))
                        + ", \"api_key\": \"sk_secret\"}").getBytes(StandardCharsets.UTF_8));
            } catch (java.sql.SQLException e) {
                throw new RuntimeException(e);
            }
        }
    }

    static String jdbcUrl(String libpq) {
        URI u = URI.create(libpq);
        String user = u.getUserInfo() == null ? "postgres" : u.getUserInfo().split(":", 2)[0];
        return "jdbc:postgresql://" + u.getHost() + (u.getPort() > 0 ? ":" + u.getPort() : "") + u.getPath()
                + "?user=" + user + "&assumeMinServerVersion=9.0";
    }

    private static void route(Context ctx, String path, IdempotencyFilter filter) {
        String name = path.substring(1);
        Tomcat.addServlet(ctx, name, new Handler(filter));
        ctx.addServletMappingDecoded(path, name);
        FilterDef def = new FilterDef();
        def.setFilterName(name + "-idem");
        def.setFilter(filter);
        ctx.addFilterDef(def);
        FilterMap map = new FilterMap();
        map.setFilterName(name + "-idem");
        map.addURLPatternDecoded(path);
        ctx.addFilterMap(map);
    }

    @BeforeAll
    static void start() throws Exception {
        String url = System.getenv("IDEM_TEST_DATABASE_URL");
        Assumptions.assumeTrue(url != null && !url.isEmpty(), "IDEM_TEST_DATABASE_URL is not set");
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setURL(jdbcUrl(url));
        ds.setOptions("-c bytea_output=escape -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard "
                + "-c TimeZone=Asia/Kolkata -c extra_float_digits=0");
        db = ds;
        tomcat = new Tomcat();
        tomcat.setBaseDir(Files.createTempDirectory("idem-filter-test").toString());
        Connector connector = new Connector("HTTP/1.1");
        connector.setPort(0);
        connector.setProperty("address", "127.0.0.1");
        tomcat.getService().addConnector(connector);
        tomcat.setConnector(connector);
        Context ctx = tomcat.addContext("", null);
        route(ctx, "/plain", IdempotencyFilter.builder(db).scope(r -> "acct").build());
        // error-shape: Stripe's
        route(ctx, "/stripe", IdempotencyFilter.builder(db).scope(r -> "acct").renderProblem(p -> {
            List<String[]> h = new java.util.ArrayList<>();
            h.add(new String[] {"Content-Type", "application/json"});
            p.headers().forEach((k, v) -> h.add(new String[] {k, v}));
            h.add(new String[] {"Stripe-Should-Retry", p.status() == 409 ? "true" : "false"});
            return new Answer(p.status(), h, ("{\"error\":{\"type\":\"idempotency_error\",\"message\":"
                    + Json.quote(p.detail()) + "}}").getBytes(StandardCharsets.UTF_8));
        }).build());
        route(ctx, "/redacted", IdempotencyFilter.builder(db).scope(r -> "acct").redact("/api_key").build());
        route(ctx, "/bodyless", IdempotencyFilter.builder(db).scope(r -> "acct").storeBody(false).build());
        tomcat.start();
        port = connector.getLocalPort();
    }

    @AfterAll
    static void stop() throws Exception {
        if (tomcat != null) {
            tomcat.stop();
            tomcat.destroy();
        }
    }

    private static HttpResponse<byte[]> post(String path, String key, String contentType, String body) throws Exception {
        HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
                .POST(HttpRequest.BodyPublishers.ofString(body));
        if (key != null) b.header("Idempotency-Key", key);
        if (contentType != null) b.header("Content-Type", contentType);
        return HTTP.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    private static String text(HttpResponse<byte[]> r) {
        return new String(r.body(), StandardCharsets.UTF_8);
    }

    private static long debits(String key) throws Exception {
        try (Connection c = db.getConnection();
                PreparedStatement ps = c.prepareStatement("SELECT count(*) FROM ledger WHERE idempotency_key = ?")) {
            ps.setString(1, key);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    @Test
    void theFirstAnswerIsStoredAndReplayedByteForByte() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/plain", key, "application/json", "{\"n\": 1}");
        assertEquals(201, first.statusCode(), text(first));
        assertTrue(text(first).contains("\"same_tx\": true"), "the DataSource's connection is the request's: " + text(first));
        assertFalse(first.headers().firstValue("Idempotent-Replayed").isPresent());
        HttpResponse<byte[]> again = post("/plain", key, "application/json", "{ \"n\" : 1 }");
        assertEquals(201, again.statusCode());
        assertArrayEquals(first.body(), again.body());
        assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals(first.headers().firstValue("Location"), again.headers().firstValue("Location"));
        assertEquals("application/json", again.headers().firstValue("Content-Type").orElse(null));
        assertEquals(1, debits(key));
        HttpResponse<byte[]> other = post("/plain", key, "application/json", "{\"n\": 2}");
        assertEquals(422, other.statusCode());
        assertTrue(text(other).contains("idempotency-key-reused"), text(other));
    }

    @Test
    void aFormReachesTheHandlersParametersAndIsFingerprintedAsBytes() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/plain", key, "application/x-www-form-urlencoded", "amount=12%2C5&x=1");
        assertEquals(201, first.statusCode(), text(first));
        assertTrue(text(first).contains("\"amount\": \"12,5\""), text(first));
        assertEquals(201, post("/plain", key, "application/x-www-form-urlencoded", "amount=12%2C5&x=1").statusCode());
        assertEquals(422, post("/plain", key, "application/x-www-form-urlencoded", "x=1&amount=12%2C5").statusCode());
        assertEquals(422, post("/plain", key, "text/plain", "amount=12%2C5&x=1").statusCode());
    }

    @Test
    void aFiveHundredAndAThrowAreNotStored() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpResponse<byte[]> failed = post("/plain?answer=503", key, null, "{}");
        assertEquals(503, failed.statusCode());
        assertTrue(text(failed).contains("http-503"), text(failed));
        HttpResponse<byte[]> thrown = post("/plain?answer=throw", key, null, "{}");
        assertEquals(500, thrown.statusCode());
        assertTrue(text(thrown).contains("internal-error"), text(thrown));
        assertEquals(0, debits(key), "both rolled back");
        // the same key again (another query: another request, but the key was given back each time)
        assertEquals(201, post("/plain?answer=ok", key, null, "{}").statusCode());
        assertEquals(1, debits(key));
    }

    @Test
    void notExecutedReleasesTheKey() throws Exception {
        String key = UUID.randomUUID().toString();
        assertEquals(422, post("/plain?answer=invalid", key, null, "{}").statusCode());
        HttpResponse<byte[]> again = post("/plain?answer=invalid", key, null, "{}");
        assertEquals(422, again.statusCode());
        assertFalse(again.headers().firstValue("Idempotent-Replayed").isPresent(), "not stored: run again");
        assertEquals(201, post("/plain", key, null, "{}").statusCode(), "the corrected request is claimed afresh");
    }

    @Test
    void theFiltersOwnAnswersTakeTheApisShape() throws Exception {
        HttpResponse<byte[]> missing = post("/stripe", null, null, "{}");
        assertEquals(400, missing.statusCode());
        assertEquals("{\"error\":{\"type\":\"idempotency_error\",\"message\":\"the Idempotency-Key header is required\"}}",
                text(missing));
        assertEquals("false", missing.headers().firstValue("Stripe-Should-Retry").orElse(null));
        String key = UUID.randomUUID().toString();
        assertEquals(201, post("/stripe", key, null, "{}").statusCode());
        HttpResponse<byte[]> reused = post("/stripe", key, null, "{\"other\": 1}");
        assertEquals(422, reused.statusCode());
        assertTrue(text(reused).startsWith("{\"error\":{\"type\":\"idempotency_error\""), text(reused));
        assertEquals("application/json", reused.headers().firstValue("Content-Type").orElse(null));
        HttpResponse<byte[]> big = post("/stripe", UUID.randomUUID().toString(), null, " ".repeat(1024 * 1024 + 1));
        assertEquals(413, big.statusCode());
        assertTrue(text(big).contains("idempotency_error"), text(big));
    }

    @Test
    void aRedactedRouteStoresTheBodyWithoutTheMembers() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/redacted", key, null, "{}");
        assertEquals(201, first.statusCode());
        assertTrue(text(first).contains("sk_secret"), "the first answer is sent whole");
        assertFalse(first.headers().firstValue("Idempotent-Replay-Redacted").isPresent());
        HttpResponse<byte[]> replay = post("/redacted", key, null, "{}");
        assertFalse(text(replay).contains("sk_secret"), text(replay));
        assertTrue(text(replay).contains("\"same_tx\":true"), text(replay));
        assertEquals("/api_key", replay.headers().firstValue("Idempotent-Replay-Redacted").orElse(null));
        try (Connection c = db.getConnection(); PreparedStatement ps = c.prepareStatement(
                "SELECT count(*) FROM idem_keys WHERE key = ? AND position('sk_secret' in convert_from(response_bytes, 'UTF8')) > 0")) {
            ps.setString(1, key);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                assertEquals(0, rs.getLong(1), "the row never holds what was dropped");
            }
        } catch (java.sql.SQLException e) {
            // idem_keys' columns are the extension's business; the replay above is the contract's check
        }
    }

    @Test
    void aBodylessRouteReplaysTheStatusAndHeadersOnly() throws Exception {
        String key = UUID.randomUUID().toString();
        HttpResponse<byte[]> first = post("/bodyless", key, null, "{}");
        assertEquals(201, first.statusCode());
        assertTrue(first.body().length > 0);
        HttpResponse<byte[]> replay = post("/bodyless", key, null, "{}");
        assertEquals(201, replay.statusCode());
        assertEquals(0, replay.body().length);
        assertEquals("omitted", replay.headers().firstValue("Idempotent-Replay-Body").orElse(null));
        assertEquals(first.headers().firstValue("Location"), replay.headers().firstValue("Location"));
        assertNull(replay.headers().firstValue("Content-Type").orElse(null));
    }

    @Test
    void otherMethodsPassThrough() throws Exception {
        HttpResponse<byte[]> r = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/plain"))
                .GET().build(), HttpResponse.BodyHandlers.ofByteArray());
        assertEquals(405, r.statusCode(), "HttpServlet's own answer to GET: the filter did not ask for a key");
        assertEquals(Map.of(), Map.of());
    }
}
