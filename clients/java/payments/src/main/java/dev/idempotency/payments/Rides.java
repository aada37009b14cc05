package dev.idempotency.payments;

import dev.idempotency.servlet.Answer;
import dev.idempotency.servlet.IdempotencyFilter;
import dev.idempotency.servlet.Json;
import dev.idempotency.servlet.KeyHeader;
import dev.idempotency.servlet.Lease;
import dev.idempotency.servlet.Problem;
import dev.idempotency.servlet.ProblemException;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.Collections;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.sql.DataSource;

/**
 * POST /rides (CONTRACT.md lease-rides): the rocket-rides story in lease mode. The charge at a simulated payment
 * provider and the receipt from a simulated mailer are outside calls, each made with no transaction open, so the
 * request runs with {@link Lease} (a heartbeat, a recovery point per step) instead of the transactional filter.
 */
final class Rides {
    private static final Pattern STALL = Pattern.compile("^stall=(\\d{1,7})$");
    /** The exit status of the crash-* faults. */
    static final int CRASH_STATUS = 70;

    private final DataSource pool;
    private final boolean faults;
    private final Lease lease;

    Rides(DataSource pool, boolean faults, int leaseSeconds) {
        this.pool = pool;
        this.faults = faults;
        this.lease = Lease.builder(pool).leaseSeconds(leaseSeconds).replayHeaders("Content-Type", "Location").build();
    }

    void handle(HttpServletRequest req, HttpServletResponse res) throws IOException {
        Payments.send(res, answer(req));
    }

    private Answer answer(HttpServletRequest req) {
        String account;
        try {
            account = Payments.authenticate(req);
        } catch (ProblemException e) {
            return e.answer();
        }
        String key;
        try {
            key = KeyHeader.parse(Collections.list(req.getHeaders("Idempotency-Key")));
        } catch (KeyHeader.KeyException e) {
            return Problem.answer(400, e.slug(), e.missing() ? "Idempotency-Key required" : "Invalid Idempotency-Key",
                    e.getMessage());
        }
        byte[] raw;
        try {
            raw = IdempotencyFilter.readBody(req, Payments.BODY_LIMIT);
        } catch (IOException e) {
            return e instanceof IdempotencyFilter.TooLarge
                    ? Problem.answer(413, "request-too-large", "Request body too large",
                            "the request body is over " + Payments.BODY_LIMIT + " bytes", "Connection", "close")
                    : Problem.answer(400, "request-body-unreadable", "Unreadable request body",
                            "the request body ended before its Content-Length; nothing was done", "Connection", "close");
        }
        String contentType = req.getHeader("Content-Type");
        // the body read whole, handed to the payment reader as the filter hands it (form and multipart parsed from it)
        Payments.Payment payment = Payments.paymentOf(IdempotencyFilter.replaying(req, raw));
        if (payment == null) {
            return Problem.answer(400, "request-body-not-json", "Malformed request body", "the request body is not JSON");
        }
        if (payment.error() != null) {
            // not executed: answered before any lease, so nothing is stored and the corrected retry is claimed afresh
            return Problem.answer(422, "invalid-payment", "Invalid payment", payment.error());
        }
        String fault = faults && req.getHeader("X-Fault") != null ? req.getHeader("X-Fault").trim() : "";
        long amount = payment.amount();
        String currency = payment.currency();

        Lease.Step charge = new Lease.Step("charge_created", ctx -> {
            if (fault.equals("provider-503")) {
                // the provider refused before charging: the lease is given back, nothing is stored
                throw new ProviderUnavailable();
            }
            // the provider call: idempotent on (account, key), as a real provider is on its Idempotency-Key
            String chargeId;
            try (Connection c = pool.getConnection(); PreparedStatement ps = c.prepareStatement(
                    "INSERT INTO provider_charges (account, idempotency_key, amount_cents, currency) VALUES (?, ?, ?, ?) "
                    + "ON CONFLICT (account, idempotency_key) DO UPDATE SET amount_cents = EXCLUDED.amount_cents "
                    + "RETURNING charge_id")) {
                ps.setString(1, account);
                ps.setString(2, key);
                ps.setLong(3, amount);
                ps.setString(4, currency);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    chargeId = rs.getString(1);
                }
            }
            if (fault.equals("crash-after-charge")) Runtime.getRuntime().halt(CRASH_STATUS);
            Matcher stall = STALL.matcher(fault);
            if (stall.matches()) {
                ctx.stopHeartbeat(); // a stalled holder: its lease runs out and a retry takes over
                Thread.sleep(Long.parseLong(stall.group(1)));
            }
            ctx.transaction(c -> {
                try (PreparedStatement ps = c.prepareStatement("INSERT INTO rides (account, idempotency_key, "
                        + "amount_cents, currency, charge_id, fencing_number) VALUES (?, ?, ?, ?, ?, ?) RETURNING id")) {
                    ps.setString(1, account);
                    ps.setString(2, key);
                    ps.setLong(3, amount);
                    ps.setString(4, currency);
                    ps.setString(5, chargeId);
                    if (ctx.fencingNumber() == null) ps.setNull(6, java.sql.Types.BIGINT);
                    else ps.setLong(6, ctx.fencingNumber());
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        ctx.state().put("ride_id", rs.getLong(1));
                    }
                }
                ctx.state().put("charge_id", chargeId);
            });
            if (fault.equals("crash-after-checkpoint")) Runtime.getRuntime().halt(CRASH_STATUS);
        });
        Lease.Step receipt = new Lease.Step("receipt_sent", ctx -> {
            // the mailer: one receipt per (account, key), however often it is asked
            try (Connection c = pool.getConnection(); PreparedStatement ps = c.prepareStatement(
                    "INSERT INTO receipts (account, idempotency_key, ride_id) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")) {
                ps.setString(1, account);
                ps.setString(2, key);
                ps.setLong(3, number(ctx.state().get("ride_id")));
                ps.executeUpdate();
            }
        });
        try {
            return lease.run(new Lease.Request(key, account, "POST", "/rides", null, contentType, raw),
                    List.of(charge, receipt), (c, ctx) -> {
                        long rideId = number(ctx.state().get("ride_id"));
                        String chargeId = String.valueOf(ctx.state().get("charge_id"));
                        try (PreparedStatement ps = c.prepareStatement(
                                "UPDATE rides SET receipt_sent = true WHERE id = ?")) {
                            ps.setLong(1, rideId);
                            ps.executeUpdate();
                        }
                        return Answer.json(201, "{\"ride_id\":" + rideId + ",\"account\":" + Json.quote(account)
                                + ",\"amount_cents\":" + amount + ",\"currency\":" + Json.quote(currency)
                                + ",\"charge_id\":" + Json.quote(chargeId) + "}", "Location", "/rides/" + rideId);
                    });
        } catch (ProviderUnavailable e) {
            return Problem.answer(503, "provider-unavailable", "Service Unavailable", "the payment provider answered 503");
        } catch (Exception e) {
            System.err.println("payments: /rides failed: " + e);
            e.printStackTrace();
            return Problem.answer(500, "internal-error", "Internal Server Error", "the request failed; retry it");
        }
    }

    private static long number(Object v) {
        if (v instanceof Json.Num n) return Long.parseLong(n.text());
        if (v instanceof Number n) return n.longValue();
        throw new IllegalStateException("not a number in the lease's state: " + v);
    }

    private static final class ProviderUnavailable extends Exception {
        ProviderUnavailable() {
            super("the payment provider answered 503");
        }
    }
}
