package dev.idempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The claim's text form in every bytea_output, the JSON reader and writer, and store-less' redaction. */
class CodecTest {
    @Test
    void claimedReadsAsFiveNulls() {
        ClaimRecord c = ClaimRecord.parse("(claimed,,,,)");
        assertEquals("claimed", c.outcome());
        assertNull(c.httpStatus());
        assertNull(c.body());
    }

    @Test
    void replayInBothByteaForms() {
        byte[] want = "{\"a\": \"x\\\\y\"}\n\u00ff".getBytes(StandardCharsets.ISO_8859_1);
        // bytea_output = hex, and the same bytes under bytea_output = escape (its backslashes doubled once by
        // bytea, once more by the record's quoting)
        ClaimRecord hex = ClaimRecord.parse("(replay,201,application/json,\"{\"\"Location\"\": \"\"/p/1\"\"}\","
                + "\"\\\\x7b2261223a2022785c5c79227d0aff\")");
        ClaimRecord esc = ClaimRecord.parse("(replay,201,application/json,\"{\"\"Location\"\": \"\"/p/1\"\"}\","
                + "\"{\"\"a\"\": \"\"x\\\\\\\\\\\\\\\\y\"\"}\\\\012\\\\377\")");
        assertArrayEquals(want, hex.body());
        assertArrayEquals(want, esc.body());
        assertEquals(201, hex.httpStatus());
        assertEquals("{\"Location\": \"/p/1\"}", hex.headers());
    }

    @Test
    void theClaimsHeadersOfAnotherOutcomeAreTheKeysExpiry() {
        ClaimRecord c = ClaimRecord.parse("(mismatch,422,,\"{\"\"Idempotency-Key-Expires\"\": \"\"Tue, 08 Dec 2026 10:30:00 GMT\"\"}\",)");
        assertEquals(422, c.httpStatus());
        List<String[]> h = IdempotencyFilter.claimHeaders(c.headers());
        assertEquals(1, h.size());
        assertEquals("Idempotency-Key-Expires", h.get(0)[0]);
        assertEquals("Tue, 08 Dec 2026 10:30:00 GMT", h.get(0)[1]);
        assertEquals(0, IdempotencyFilter.claimHeaders(null).size(), "1.3: NULL");
    }

    @Test
    void malformedByteaIsRefused() {
        assertThrows(IllegalArgumentException.class, () -> ClaimRecord.bytea("\\x7"));
        assertThrows(IllegalArgumentException.class, () -> ClaimRecord.bytea("\\9"));
    }

    @Test
    void jsonKeepsNumbersAsWrittenAndTheLastDuplicate() {
        Object v = Json.parse(" {\"a\": 1e2, \"b\": 1.0, \"a\": 100, \"s\": \"\\u00e9\\n\"} ");
        Map<?, ?> m = (Map<?, ?>) v;
        assertEquals(new Json.Num("100"), m.get("a"));
        assertEquals(new Json.Num("1.0"), m.get("b"));
        assertEquals("{\"a\":100,\"b\":1.0,\"s\":\"\u00e9\\n\"}", Json.write(v));
        for (String bad : new String[] {"", "{", "[1,]", "01", "1.", "\"a", "{\"a\" 1}", "tru", "1 2"}) {
            assertThrows(IllegalArgumentException.class, () -> Json.parse(bad), bad);
        }
        assertEquals("\"\\u0001\\\"\\\\\\ud800\"", Json.quote("\u0001\"\\\ud800"));
    }

    @Test
    void redactDropsThePresentMembersAndSaysWhich() {
        Answer a = Answer.json(201, "{\"id\": 1, \"card\": {\"number\": \"4242\", \"exp\": \"12/30\"}, \"api_key\": \"s\"}");
        Answer kept = Redaction.toStore(a, List.of("/api_key", "/card/number", "/missing"), true);
        assertEquals("{\"id\":1,\"card\":{\"exp\":\"12/30\"}}", new String(kept.body(), StandardCharsets.UTF_8));
        assertEquals("/api_key, /card/number", kept.header("Idempotent-Replay-Redacted"));
        Answer text = new Answer(200, List.<String[]>of(new String[] {"Content-Type", "text/plain"}),
                "{\"api_key\": 1}".getBytes(StandardCharsets.UTF_8));
        assertEquals(text, Redaction.toStore(text, List.of("/api_key"), true), "only a JSON object body is redacted");
        Answer none = Redaction.toStore(a, List.of(), false);
        assertEquals(0, none.body().length);
        assertNull(none.header("Content-Type"));
        assertEquals("omitted", none.header("Idempotent-Replay-Body"));
        assertThrows(IllegalArgumentException.class, () -> Redaction.tokens("api_key"));
    }
}
