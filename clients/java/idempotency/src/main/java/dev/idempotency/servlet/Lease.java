package dev.idempotency.servlet;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.UUID;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import javax.sql.DataSource;
import org.postgresql.util.PGInterval;

/**
 * Lease mode (CONTRACT.md lease-rides), for a handler that calls something outside the database: the key is leased
 * ({@code idem_lease}, committed at once), then the steps after the key's recovery point run, each with no
 * transaction open, while a heartbeat extends the lease every third of its length on a connection of its own. A
 * step records itself ({@code idem_checkpoint}, with {@link Context#state()}) in {@link Context#transaction}, with
 * its local writes, or, without writes, in a transaction of the runner's; {@link Finish} builds the answer in the
 * completing transaction, which stores it ({@code idem_lease_complete_request}, the bytes sent; a 5xx is not
 * stored and gives the lease back). Every transaction of the holder starts with {@code idem_lease_extend}: a
 * holder whose lease was taken over gets SQLSTATE 55000 there, before any write, and stops: 409
 * {@code Retry-After: 1}. Any other failure gives the lease back (the recovery point kept) and is thrown.
 */
public final class Lease {
    static final String LEASE_SQL = "SELECT l.*, l.response_headers::text AS idem_headers_text, "
            + "l.recovery_state::text AS idem_state_text FROM idem_lease(?, idem_fingerprint(?, ?, ?, ?, ?), "
            + "make_interval(secs => ?), ?, ?) AS l";
    static final String EXTEND_SQL = "SELECT idem_lease_extend(?, ?, make_interval(secs => ?), ?)";
    static final String CHECKPOINT_SQL = "SELECT idem_checkpoint(?, ?, ?, ?, ?)";
    static final String COMPLETE_SQL = "SELECT idem_lease_complete_request(?, ?, ?, ?, ?, ?, ?)";
    static final String RELEASE_SQL = "SELECT idem_lease_release(?, ?, ?)";
    public static final String LEASE_LOST = "55000";
    private static final ScheduledExecutorService HEARTBEATS = Executors.newScheduledThreadPool(1, r -> {
        Thread t = new Thread(r, "idempotency-lease-heartbeat");
        t.setDaemon(true);
        return t;
    });
    private static final System.Logger LOG = System.getLogger(Lease.class.getName());

    /** One step: its name is the recovery point it records. */
    public record Step(String name, Body body) {
        public Step {
            Objects.requireNonNull(name);
            Objects.requireNonNull(body);
        }
    }

    /** A step's work. */
    @FunctionalInterface
    public interface Body {
        void run(Context ctx) throws Exception;
    }

    /** Work inside a holder's transaction, on its connection. */
    @FunctionalInterface
    public interface Work {
        void run(Connection c) throws Exception;
    }

    /** Builds the answer in the completing transaction (on its connection). */
    @FunctionalInterface
    public interface Finish {
        Answer finish(Connection c, Context ctx) throws Exception;
    }

    /** The lease was taken over: stop, write nothing more (thrown by {@link Context#transaction}). */
    public static final class LeaseLost extends Exception {
        LeaseLost(String key, Throwable cause) {
            super("idempotency: the lease of key " + key + " was taken over by another attempt", cause);
        }
    }

    private final DataSource pool;
    private final double leaseSeconds;
    private final Duration ttl;
    private final java.util.Set<String> replayHeaders;
    private final Problem.Renderer renderer;
    private final List<String> redact;
    private final boolean storeBody;

    private Lease(Builder b) {
        pool = Objects.requireNonNull(b.pool);
        leaseSeconds = b.leaseSeconds;
        ttl = b.ttl;
        replayHeaders = b.replayHeaders;
        renderer = b.renderer;
        redact = b.redact;
        storeBody = b.storeBody;
    }

    public static Builder builder(DataSource pool) {
        return new Builder(pool);
    }

    public static final class Builder {
        private final DataSource pool;
        private double leaseSeconds = 30;
        private Duration ttl;
        private java.util.Set<String> replayHeaders;
        private Problem.Renderer renderer = Problem.PROBLEM_JSON;
        private List<String> redact = List.of();
        private boolean storeBody = true;

        private Builder(DataSource pool) {
            this.pool = pool;
        }

        /** The lease's length (default 30 s); the heartbeat extends it every third of it. */
        public Builder leaseSeconds(double s) {
            if (!(s > 0)) throw new IllegalArgumentException("leaseSeconds must be > 0");
            leaseSeconds = s;
            return this;
        }

        public Builder ttl(Duration ttl) {
            this.ttl = ttl;
            return this;
        }

        public Builder replayHeaders(String... names) {
            java.util.Set<String> s = new java.util.TreeSet<>();
            for (String n : names) s.add(n.toLowerCase(java.util.Locale.ROOT));
            replayHeaders = s;
            return this;
        }

        public Builder renderProblem(Problem.Renderer r) {
            renderer = Objects.requireNonNull(r);
            return this;
        }

        public Builder redact(String... pointers) {
            for (String p : pointers) Redaction.tokens(p);
            redact = List.of(pointers);
            return this;
        }

        public Builder storeBody(boolean b) {
            storeBody = b;
            return this;
        }

        public Lease build() {
            return new Lease(this);
        }
    }

    /** A run's state, handed to each step. */
    public final class Context {
        private final String key;
        private final String scope;
        private final UUID token;
        private final Long fencingNumber;
        private final Map<String, Object> state;
        private volatile boolean lost;
        private boolean recorded;
        private String step;
        private ScheduledFuture<?> beat;
        private List<String[]> claimHeaders = List.of();

        Context(String key, String scope, UUID token, Long fencingNumber, Map<String, Object> state) {
            this.key = key;
            this.scope = scope;
            this.token = token;
            this.fencingNumber = fencingNumber;
            this.state = state;
        }

        public String key() {
            return key;
        }

        public String scope() {
            return scope;
        }

        /** The lease's fencing number (1.2+), or null. */
        public Long fencingNumber() {
            return fencingNumber;
        }

        /** The state recorded with each checkpoint (JSON: strings, numbers, booleans, maps, lists). */
        public Map<String, Object> state() {
            return state;
        }

        /** Stops the heartbeat (a stalled holder, for tests): the lease can run out and be taken over. */
        public void stopHeartbeat() {
            if (beat != null) beat.cancel(false);
        }

        /**
         * The step's local writes and its checkpoint in one transaction, which starts with idem_lease_extend (a
         * holder whose lease was taken over gets {@link LeaseLost} there, before any write).
         */
        public void transaction(Work work) throws Exception {
            holderTransaction(this, work::run, checkpoint(this, step));
            recorded = true;
        }
    }

    private interface Last {
        void bind(PreparedStatement ps) throws SQLException;
    }

    private record Statement(String sql, Last bind) {}

    private Statement checkpoint(Context ctx, String step) {
        return new Statement(CHECKPOINT_SQL, ps -> {
            ps.setString(1, ctx.key);
            ps.setObject(2, ctx.token);
            ps.setString(3, step);
            ps.setObject(4, Json.write(ctx.state), Types.OTHER); // the state as the step's work left it
            ps.setString(5, ctx.scope);
        });
    }

    private static SQLException sql(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) if (t instanceof SQLException s) return s;
        return null;
    }

    private static boolean lostBy(Throwable e) {
        if (e instanceof LeaseLost) return true;
        SQLException s = sql(e);
        return s != null && LEASE_LOST.equals(s.getSQLState());
    }

    /** A holder's transaction: idem_lease_extend first, then work, then the last statement, COMMIT. */
    private void holderTransaction(Context ctx, Work work, Statement last) throws Exception {
        if (ctx.lost) throw new LeaseLost(ctx.key, null);
        try (Connection c = pool.getConnection()) {
            c.setAutoCommit(false);
            try {
                extend(c, ctx);
                if (work != null) work.run(c);
                try (PreparedStatement ps = c.prepareStatement(last.sql())) {
                    last.bind().bind(ps);
                    ps.executeQuery().close();
                }
                c.commit();
            } catch (Exception e) {
                try {
                    c.rollback();
                } catch (SQLException x) {
                    // the pool finds it broken
                }
                if (lostBy(e)) throw new LeaseLost(ctx.key, e);
                throw e;
            } finally {
                try {
                    c.setAutoCommit(true);
                } catch (SQLException x) {
                    // as above
                }
            }
        }
    }

    private void extend(Connection c, Context ctx) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(EXTEND_SQL)) {
            ps.setString(1, ctx.key);
            ps.setObject(2, ctx.token);
            ps.setDouble(3, leaseSeconds);
            ps.setString(4, ctx.scope);
            ps.executeQuery().close();
        }
    }

    private void release(Context ctx) {
        try (Connection c = pool.getConnection(); PreparedStatement ps = c.prepareStatement(RELEASE_SQL)) {
            ps.setString(1, ctx.key);
            ps.setObject(2, ctx.token);
            ps.setString(3, ctx.scope);
            ps.executeQuery().close();
        } catch (SQLException e) {
            // 55000: not ours any more; anything else: the lease runs out on its own
            if (!LEASE_LOST.equals(e.getSQLState())) {
                LOG.log(System.Logger.Level.ERROR, "idempotency: releasing the lease of " + ctx.key + " failed: " + e);
            }
        }
    }

    /** The request, as the lease's fingerprint takes it (idem_fingerprint: rule any-body, raw-target). */
    public record Request(String key, String scope, String method, String path, String query, String contentType,
            byte[] body) {}

    /**
     * Lease the request's key and run the steps after its recovery point, then {@code finish}. The answer to send:
     * a replay, 422 mismatch, 409 in flight or taken over, 410 expired, or finish's (stored unless a 5xx). A step's
     * or finish's exception is thrown after the lease is given back.
     */
    public Answer run(Request r, List<Step> steps, Finish finish) throws Exception {
        List<String> names = new ArrayList<>();
        for (Step s : steps) names.add(s.name());
        Context ctx;
        String recoveryPoint;
        try (Connection c = pool.getConnection(); PreparedStatement ps = c.prepareStatement(LEASE_SQL)) {
            ps.setString(1, r.key());
            ps.setString(2, r.method());
            ps.setString(3, r.path());
            ps.setString(4, r.query());
            ps.setString(5, r.contentType());
            ps.setBytes(6, r.body());
            ps.setDouble(7, leaseSeconds);
            if (ttl == null) ps.setNull(8, Types.OTHER);
            else ps.setObject(8, new PGInterval(0, 0, 0, 0, 0, ttl.toMillis() / 1000.0));
            ps.setString(9, r.scope());
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                String outcome = rs.getString("outcome");
                String headers = rs.getString("idem_headers_text");
                if (!outcome.equals("claimed")) {
                    int st = rs.getInt("http_status");
                    ClaimRecord claim = new ClaimRecord(outcome, rs.wasNull() ? null : st,
                            rs.getString("response_content_type"), headers, rs.getBytes("response_bytes"));
                    return IdempotencyFilter.render(IdempotencyFilter.answerOf(claim, Problem.BASE), renderer);
                }
                long fencing = rs.getLong("fencing_number");
                Long fencingNumber = rs.wasNull() ? null : fencing;
                String stateText = rs.getString("idem_state_text");
                Map<String, Object> state = new LinkedHashMap<>();
                if (stateText != null && Json.parse(stateText) instanceof Map<?, ?> m) {
                    m.forEach((k, v) -> state.put(String.valueOf(k), v));
                }
                ctx = new Context(r.key(), r.scope(), UUID.fromString(rs.getString("lease_token")), fencingNumber,
                        state);
                ctx.claimHeaders = IdempotencyFilter.claimHeaders(headers); // 1.4, rule key-lifetime
                recoveryPoint = rs.getString("recovery_point");
            }
        }
        int start = 0;
        if (recoveryPoint != null) {
            start = names.indexOf(recoveryPoint) + 1;
            if (start == 0) {
                release(ctx);
                throw new IllegalStateException("idempotency: the recovery point " + recoveryPoint + " of key "
                        + r.key() + " is no step's name " + names);
            }
        }
        long every = Math.max(1, (long) (leaseSeconds * 1000 / 3));
        Context run = ctx;
        ctx.beat = HEARTBEATS.scheduleWithFixedDelay(() -> heartbeat(run), every, every, TimeUnit.MILLISECONDS);
        try {
            for (Step s : steps.subList(start, steps.size())) {
                ctx.step = s.name();
                ctx.recorded = false;
                s.body().run(ctx);
                if (ctx.lost) throw new LeaseLost(ctx.key, null);
                if (!ctx.recorded) holderTransaction(ctx, null, checkpoint(ctx, s.name()));
            }
            ctx.step = null;
            return complete(ctx, finish);
        } catch (Exception e) {
            if (lostBy(e)) {
                LOG.log(System.Logger.Level.INFO, "idempotency: lease of " + r.key() + " lost, stopping");
                return renderer.render(new Problem(409, "idempotency-key-in-progress", "Request in progress",
                        "this request's lease was taken over by another attempt; retry later",
                        Map.of("Retry-After", "1")));
            }
            release(ctx);
            throw e;
        } finally {
            ctx.beat.cancel(false);
        }
    }

    private void heartbeat(Context ctx) {
        try (Connection c = pool.getConnection()) {
            extend(c, ctx);
        } catch (SQLException e) {
            if (LEASE_LOST.equals(e.getSQLState())) {
                ctx.lost = true;
                ctx.beat.cancel(false);
            } else {
                LOG.log(System.Logger.Level.ERROR, "idempotency: lease heartbeat of " + ctx.key + " failed: " + e);
            }
        }
    }

    /** A 5xx from finish: rolled back, not stored. */
    private static final class NotStored extends Exception {
        final transient Answer answer;

        NotStored(Answer a) {
            super("a 5xx is not stored");
            answer = a;
        }
    }

    private Answer complete(Context ctx, Finish finish) throws Exception {
        Answer[] sent = new Answer[1];
        Statement[] last = new Statement[1];
        try {
            holderTransaction(ctx, c -> {
                Answer a = finish.finish(c, ctx);
                if (a.status() >= 500) throw new NotStored(a);
                sent[0] = a;
                Answer kept = Redaction.toStore(a, redact, storeBody);
                String[] stored = IdempotencyFilter.storedHeaders(kept, replayHeaders);
                last[0] = new Statement(COMPLETE_SQL, ps -> {
                    ps.setString(1, ctx.key);
                    ps.setString(2, ctx.scope);
                    ps.setObject(3, ctx.token);
                    ps.setInt(4, kept.status());
                    ps.setString(5, stored[0]);
                    ps.setObject(6, stored[1], Types.OTHER);
                    ps.setBytes(7, storeBody ? kept.body() : null);
                });
            }, new Statement(COMPLETE_SQL, ps -> last[0].bind().bind(ps)));
        } catch (NotStored e) {
            release(ctx);
            return e.answer;
        }
        Answer out = sent[0];
        for (String[] h : ctx.claimHeaders) out = out.withHeader(h[0], h[1]); // never stored: added as sent
        return out;
    }
}
