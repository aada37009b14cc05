package dev.idempotency.payments;

import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import javax.sql.DataSource;

/** POST /rides (CONTRACT.md lease-rides). */
final class Rides {
    private final DataSource pool;
    private final boolean faults;
    private final int leaseSeconds;

    Rides(DataSource pool, boolean faults, int leaseSeconds) {
        this.pool = pool;
        this.faults = faults;
        this.leaseSeconds = leaseSeconds;
    }

    void handle(HttpServletRequest req, HttpServletResponse res) throws IOException {
        Payments.problem(res, 501, "not-implemented", "Not Implemented", "lease mode is not built yet");
    }
}
