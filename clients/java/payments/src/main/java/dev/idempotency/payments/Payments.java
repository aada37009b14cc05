package dev.idempotency.payments;

import dev.idempotency.servlet.Answer;
import dev.idempotency.servlet.Idempotency;
import dev.idempotency.servlet.Json;
import dev.idempotency.servlet.Problem;
import dev.idempotency.servlet.ProblemException;
import jakarta.servlet.ServletException;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import jakarta.servlet.http.Part;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Collections;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.sql.DataSource;

/**
 * The payment service of clients/CONTRACT.md as one servlet: POST /payments, /files/<name> and /documents behind
 * the IdempotencyFilter (which hands the handler the request's connection), /payments-unprotected in a
 * transaction of its own, /rides (lease mode), GET /healthz; 405 and 404 as problem+json.
 */
public final class Payments extends HttpServlet {
    private static final Pattern BEARER = Pattern.compile("^[Bb][Ee][Aa][Rr][Ee][Rr] ([a-z0-9_]{1,64})$");
    private static final Pattern CURRENCY = Pattern.compile("^[A-Z]{3}$");
    private static final Pattern AMOUNT_TEXT = Pattern.compile("^[1-9][0-9]{0,15}$");
    private static final long MAX_SAFE = 9007199254740991L;
    static final String UNAUTHORIZED = "send Authorization: Bearer <account>, the account being [a-z0-9_]{1,64}";
    static final String NOT_AN_OBJECT =
            "the body must be a JSON object {\"amount_cents\": <integer > 0>, \"currency\": \"<ISO 4217>\"}";
    static final String AMOUNT = "amount_cents must be an integer from 1 to " + MAX_SAFE;
    static final long BODY_LIMIT = 1024 * 1024;

    private final DataSource pool;
    private final boolean faults;
    private final Rides rides;

    Payments(DataSource pool, boolean faults, Rides rides) {
        this.pool = pool;
        this.faults = faults;
        this.rides = rides;
    }

    /** The account of {@code Authorization: Bearer <account>} (one header line), else 401. The scope is the account. */
    static String authenticate(HttpServletRequest req) {
        List<String> lines = Collections.list(req.getHeaders("Authorization"));
        Matcher m = lines.size() == 1 ? BEARER.matcher(lines.get(0)) : null;
        if (m == null || !m.matches()) {
            throw new ProblemException(Problem.answer(401, "unauthorized", "Unauthorized", UNAUTHORIZED,
                    "WWW-Authenticate", "Bearer"));
        }
        return m.group(1);
    }

    static void send(HttpServletResponse res, Answer a) throws IOException {
        res.setStatus(a.status());
        for (String[] h : a.headers()) {
            if (h[0].equalsIgnoreCase("Content-Type")) res.setContentType(h[1]);
            else res.addHeader(h[0], h[1]);
        }
        res.setContentLength(a.body().length);
        res.getOutputStream().write(a.body());
    }

    static void problem(HttpServletResponse res, int status, String type, String title, String detail,
            String... headers) throws IOException {
        send(res, Problem.answer(status, type, title, detail, headers));
    }

    @Override
    protected void service(HttpServletRequest req, HttpServletResponse res) throws ServletException, IOException {
        String path = req.getRequestURI();
        String method = req.getMethod();
        boolean post = method.equals("POST");
        if (path.equals("/healthz")) {
            if (method.equals("GET") || method.equals("HEAD")) send(res, Answer.json(200, "{\"ok\":true}"));
            else notAllowed(req, res, "GET, HEAD");
        } else if (path.equals("/payments") || (path.startsWith("/files/") && path.length() > "/files/".length())) {
            if (post) pay(req, res, Idempotency.of(req));
            else notAllowed(req, res, "POST");
        } else if (path.equals("/documents")) {
            if (post) document(req, res, Idempotency.of(req));
            else notAllowed(req, res, "POST");
        } else if (path.equals("/payments-unprotected")) {
            if (post) unprotected(req, res);
            else notAllowed(req, res, "POST");
        } else if (path.equals("/rides")) {
            if (post) rides.handle(req, res);
            else notAllowed(req, res, "POST");
        } else {
            problem(res, 404, "not-found", "Not Found", path + " is not a resource here");
        }
    }

    private static void notAllowed(HttpServletRequest req, HttpServletResponse res, String allow) throws IOException {
        problem(res, 405, "method-not-allowed", "Method Not Allowed", req.getMethod() + " is not allowed here",
                "Allow", allow);
    }

    /** A payment: the amount and currency, or the error that refuses it. */
    record Payment(long amount, String currency, String error) {}

    static Payment fields(String amount, String currency) {
        if (amount == null || !AMOUNT_TEXT.matcher(amount).matches() || Long.parseLong(amount) > MAX_SAFE) {
            return new Payment(0, null, AMOUNT);
        }
        if (currency == null || !CURRENCY.matcher(currency).matches()) {
            return new Payment(0, null, "currency must be 3 upper-case letters");
        }
        return new Payment(Long.parseLong(amount), currency, null);
    }

    /** The payment of a JSON text: an object (null counts as one without members) as CONTRACT.md reads it. */
    static Payment json(String text) {
        Object v = Json.parse(text);
        if (v == Json.NULL) return fields(null, null);
        if (!(v instanceof Map<?, ?> m)) return new Payment(0, null, NOT_AN_OBJECT);
        Object amount = m.get("amount_cents");
        Object currency = m.get("currency");
        return fields(amount instanceof Json.Num n ? n.text() : null, currency instanceof String s ? s : null);
    }

    private static String mediaType(String contentType) {
        if (contentType == null) return "";
        int semi = contentType.indexOf(';');
        return (semi < 0 ? contentType : contentType.substring(0, semi)).trim().toLowerCase(Locale.ROOT);
    }

    /**
     * The payment a request's body says (CONTRACT.md any-body): a form's or multipart's fields as the container's
     * parsers give them (getParameter, getParts), else a JSON object; null when the body cannot be read as that.
     */
    static Payment paymentOf(HttpServletRequest req) {
        String type = mediaType(req.getContentType());
        try {
            if (type.equals("application/x-www-form-urlencoded")) {
                return fields(single(req, "amount_cents"), single(req, "currency"));
            }
            if (type.equals("multipart/form-data")) {
                Map<String, String> f = new HashMap<>();
                Map<String, Integer> count = new HashMap<>();
                for (Part p : req.getParts()) {
                    f.put(p.getName(), new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
                    count.merge(p.getName(), 1, Integer::sum);
                }
                return fields(count.getOrDefault("amount_cents", 0) == 1 ? f.get("amount_cents") : null,
                        count.getOrDefault("currency", 0) == 1 ? f.get("currency") : null);
            }
            return json(new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8));
        } catch (IOException | ServletException | RuntimeException e) {
            return null;
        }
    }

    private static String single(HttpServletRequest req, String name) {
        String[] v = req.getParameterValues(name);
        return v != null && v.length == 1 ? v[0] : null;
    }

    static String paymentJson(long id, String account, Payment p) {
        return "{\"payment_id\":" + id + ",\"account\":" + Json.quote(account) + ",\"amount_cents\":" + p.amount()
                + ",\"currency\":" + Json.quote(p.currency()) + "}";
    }

    /** The payment handler, inside the request's transaction (the filter's, or /payments-unprotected's). */
    void pay(HttpServletRequest req, HttpServletResponse res, Idempotency idem) throws IOException, ServletException {
        handlePayment(req, res, idem.connection(), idem.scope(), idem.key(), idem::notExecuted);
    }

    private void handlePayment(HttpServletRequest req, HttpServletResponse res, Connection c, String account,
            String key, Runnable notExecuted) throws IOException, ServletException {
        Payment payment = paymentOf(req);
        if (payment == null) {
            notExecuted.run();
            problem(res, 400, "request-body-not-json", "Malformed request body", "the request body is not JSON");
            return;
        }
        if (payment.error() != null) {
            // validation before any write: answered, not stored, the key released for the corrected retry
            notExecuted.run();
            problem(res, 422, "invalid-payment", "Invalid payment", payment.error());
            return;
        }
        try {
            long id;
            try (PreparedStatement ps = c.prepareStatement("INSERT INTO ledger (account, amount_cents, currency, "
                    + "idempotency_key) VALUES (?, ?, ?, ?) RETURNING id")) {
                ps.setString(1, account);
                ps.setLong(2, -payment.amount());
                ps.setString(3, payment.currency());
                ps.setString(4, key == null ? "" : key);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    id = rs.getLong(1);
                }
            }
            String fault = faults ? req.getHeader("X-Fault") : null;
            if ("503".equals(fault)) {
                problem(res, 503, "upstream-unavailable", "Service Unavailable", "upstream unavailable");
                return;
            }
            if ("throw-422".equals(fault) || "throw-502".equals(fault)) {
                // the Servlet's own HTTP error: the filter's error page answers it (problem+json http-<status>)
                int status = Integer.parseInt(fault.substring("throw-".length()));
                res.sendError(status, status == 422 ? "the payment was refused" : "the upstream failed");
                return;
            }
            if ("db-error".equals(fault)) {
                try (PreparedStatement ps = c.prepareStatement("SELECT 1/0")) {
                    ps.executeQuery();
                }
            } else if (fault != null && fault.startsWith("sleep=")) {
                try (PreparedStatement ps = c.prepareStatement("SELECT pg_sleep(? / 1000.0)")) {
                    ps.setDouble(1, Double.parseDouble(fault.substring("sleep=".length())));
                    ps.executeQuery();
                } catch (NumberFormatException e) {
                    // not a number: no sleep
                }
            }
            send(res, Answer.json(201, paymentJson(id, account, payment), "Location", "/payments/" + id));
        } catch (SQLException e) {
            throw new ServletException(e); // the filter rolls back and answers 500
        }
    }

    /** POST /documents (CONTRACT.md any-body): a body of any type, empty included, stored as its bytes. */
    void document(HttpServletRequest req, HttpServletResponse res, Idempotency idem)
            throws IOException, ServletException {
        byte[] body = req.getInputStream().readAllBytes();
        String contentType = req.getHeader("Content-Type");
        try (PreparedStatement ps = idem.connection().prepareStatement("INSERT INTO documents (account, "
                + "idempotency_key, content_type, body) VALUES (?, ?, ?, ?) RETURNING id")) {
            ps.setString(1, idem.scope());
            ps.setString(2, idem.key());
            ps.setString(3, contentType);
            ps.setBytes(4, body);
            long id;
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                id = rs.getLong(1);
            }
            String sha;
            try {
                sha = HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(body));
            } catch (NoSuchAlgorithmException e) {
                throw new ServletException(e);
            }
            send(res, Answer.json(201, "{\"document_id\":" + id + ",\"content_type\":"
                    + (contentType == null ? "null" : Json.quote(contentType)) + ",\"bytes\":" + body.length
                    + ",\"sha256\":\"" + sha + "\"}", "Location", "/documents/" + id));
        } catch (SQLException e) {
            throw new ServletException(e);
        }
    }

    /** POST /payments-unprotected: the same handler in one transaction, no key, no claim (the benchmark's baseline). */
    private void unprotected(HttpServletRequest req, HttpServletResponse res) throws IOException, ServletException {
        String account;
        try {
            account = authenticate(req);
        } catch (ProblemException e) {
            send(res, e.answer());
            return;
        }
        if (req.getContentLengthLong() > BODY_LIMIT) {
            problem(res, 413, "request-too-large", "Request body too large",
                    "the request body is over " + BODY_LIMIT + " bytes", "Connection", "close");
            return;
        }
        try (Connection c = pool.getConnection()) {
            c.setAutoCommit(false);
            boolean[] skip = {false};
            try {
                handlePayment(req, res, c, account, null, () -> skip[0] = true);
                if (skip[0] || res.getStatus() >= 500) c.rollback();
                else c.commit();
            } catch (IOException | ServletException | RuntimeException e) {
                c.rollback();
                if (!res.isCommitted()) {
                    res.reset();
                    problem(res, 500, "internal-error", "Internal Server Error", "the request failed and was rolled back");
                }
            } finally {
                c.setAutoCommit(true);
            }
        } catch (SQLException e) {
            throw new ServletException(e);
        }
    }
}
