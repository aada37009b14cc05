package dev.idempotency.servlet;

import jakarta.servlet.ServletRequest;
import java.sql.Connection;

/**
 * What the filter hands the handler of a protected request, as the request attribute {@link #ATTRIBUTE}
 * ({@code Idempotency.of(request)}): the {@link Connection} whose transaction holds the claim (run the handler's
 * statements on it; the filter commits or rolls it back, so do not commit, roll back or close it), the key, the
 * scope, and {@link #notExecuted()} for an answer given before doing anything (rule not-executed).
 */
public final class Idempotency {
    /** The request attribute that holds the handle. */
    public static final String ATTRIBUTE = Idempotency.class.getName();
    /** The request attribute that holds the request's {@link Connection} alone. */
    public static final String CONNECTION = Idempotency.class.getName() + ".connection";

    private final Connection connection;
    private final String key;
    private final String scope;
    private final int attempt;
    private volatile boolean notExecuted;

    Idempotency(Connection connection, String key, String scope, int attempt) {
        this.connection = connection;
        this.key = key;
        this.scope = scope;
        this.attempt = attempt;
    }

    /** The handle of a request the filter protects; IllegalStateException when the filter is not in front of it. */
    public static Idempotency of(ServletRequest request) {
        Object h = request.getAttribute(ATTRIBUTE);
        if (h instanceof Idempotency i) return i;
        throw new IllegalStateException("the request did not go through the IdempotencyFilter");
    }

    /** The request's connection, in the transaction that holds the claim. */
    public Connection connection() {
        return connection;
    }

    /** The Idempotency-Key, parsed. */
    public String key() {
        return key;
    }

    /** The scope the key is claimed in (the authenticated caller). */
    public String scope() {
        return scope;
    }

    /** 0 for the first run; more when SQLSTATE 40001/40P01 made the filter run the transaction again. */
    public int attempt() {
        return attempt;
    }

    /**
     * Answer without executing (validation before any write): the answer is sent as it is and the transaction
     * rolled back, nothing stored, the key released for the corrected retry. Only an answer below 500 (a 5xx is
     * never stored anyway).
     */
    public void notExecuted() {
        notExecuted = true;
    }

    boolean isNotExecuted() {
        return notExecuted;
    }
}
