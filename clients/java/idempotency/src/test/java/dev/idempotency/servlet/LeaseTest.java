package dev.idempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.postgresql.ds.PGSimpleDataSource;

/** Lease mode against IDEM_TEST_DATABASE_URL (skipped without it), under the settings FilterTest uses. */
class LeaseTest {
    private static PGSimpleDataSource db;

    @BeforeAll
    static void connect() {
        String url = System.getenv("IDEM_TEST_DATABASE_URL");
        Assumptions.assumeTrue(url != null && !url.isEmpty(), "IDEM_TEST_DATABASE_URL is not set");
        db = new PGSimpleDataSource();
        db.setURL(FilterTest.jdbcUrl(url));
        db.setOptions("-c bytea_output=escape -c DateStyle=SQL,DMY -c IntervalStyle=sql_standard "
                + "-c TimeZone=Asia/Kolkata -c extra_float_digits=0");
    }

    private static Lease.Request request(String key, String body) {
        return new Lease.Request(key, "acct", "POST", "/rides", null, "application/json",
                body.getBytes(StandardCharsets.UTF_8));
    }

    @Test
    void aFailedStepGivesTheLeaseBackAndTheRetryResumesAfterTheLastRecordedStep() throws Exception {
        Lease lease = Lease.builder(db).leaseSeconds(30).build();
        String key = UUID.randomUUID().toString();
        List<String> ran = new ArrayList<>();
        boolean[] fail = {true};
        List<Lease.Step> steps = List.of(
                new Lease.Step("one", ctx -> {
                    ran.add("one");
                    ctx.state().put("n", 41);
                }),
                new Lease.Step("two", ctx -> {
                    ran.add("two:" + Json.write(ctx.state().get("n")));
                    if (fail[0]) throw new IllegalStateException("the provider is down");
                }));
        Lease.Finish finish = (c, ctx) -> Answer.json(201, "{\"n\":" + Json.write(ctx.state().get("n")) + "}");
        assertThrows(IllegalStateException.class, () -> lease.run(request(key, "{}"), steps, finish));
        fail[0] = false;
        Answer first = lease.run(request(key, "{}"), steps, finish);
        assertEquals(List.of("one", "two:41", "two:41"), ran, "the retry resumed after step one, with its state");
        assertEquals(201, first.status());
        Answer replay = lease.run(request(key, "{ }"), steps, finish);
        assertEquals(201, replay.status());
        assertArrayEquals(first.body(), replay.body());
        assertEquals("true", replay.header("Idempotent-Replayed"));
        assertEquals(3, ran.size(), "a replay runs nothing");
        assertEquals(422, lease.run(request(key, "{\"other\": 1}"), steps, finish).status());
    }

    @Test
    void aFiveHundredFromFinishIsNotStored() throws Exception {
        Lease lease = Lease.builder(db).build();
        String key = UUID.randomUUID().toString();
        int[] runs = {0};
        List<Lease.Step> steps = List.of(new Lease.Step("only", ctx -> runs[0]++));
        assertEquals(503, lease.run(request(key, "{}"), steps,
                (c, ctx) -> Problem.answer(503, "down", "Service Unavailable", "later")).status());
        assertEquals(201, lease.run(request(key, "{}"), steps, (c, ctx) -> Answer.json(201, "{}")).status());
        assertEquals(1, runs[0], "the recorded step is not run again");
    }
}
