package dev.idempotency.servlet;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import org.junit.jupiter.api.Test;

class KeyHeaderTest {
    private static String slug(List<String> lines) {
        return assertThrows(KeyHeader.KeyException.class, () -> KeyHeader.parse(lines)).slug();
    }

    @Test
    void quotedAndBareAreOneKey() throws Exception {
        assertEquals("abc", KeyHeader.parse(List.of("abc")));
        assertEquals("abc", KeyHeader.parse(List.of("\"abc\"")));
        assertEquals("abc", KeyHeader.parse(List.of(" \t\"abc\" ")));
        assertEquals("a\"b\\c", KeyHeader.parse(List.of("\"a\\\"b\\\\c\"")));
        assertEquals("a,b", KeyHeader.parse(List.of("\"a,b\"")), "a comma inside a quoted key is part of it");
        assertEquals("a b", KeyHeader.parse(List.of("\"a b\"")));
    }

    @Test
    void missingIsItsOwnProblem() {
        assertEquals("idempotency-key-missing", slug(List.of()));
        assertTrue(assertThrows(KeyHeader.KeyException.class, () -> KeyHeader.parse(List.of())).missing());
    }

    @Test
    void refused() {
        for (String bad : new String[] {"", "\"\"", "\"abc", "\"a\\x\"", "\"abc\"x", "a b", "a\"b", "a\u0001b", "caf\u00e9",
                "\"a\u007fb\"", "x".repeat(256)}) {
            assertEquals("idempotency-key-invalid", slug(List.of(bad)), bad);
        }
        assertEquals("x".repeat(255), assertDoesNotThrow("x".repeat(255)));
    }

    private static String assertDoesNotThrow(String v) {
        try {
            return KeyHeader.parse(List.of(v));
        } catch (KeyHeader.KeyException e) {
            throw new AssertionError(e);
        }
    }

    @Test
    void severalKeysAreRefused() {
        for (List<String> lines : List.of(List.of("k1", "k2"), List.of("k1,k2"), List.of("k1, k2"),
                List.of("\"k1\", \"k2\""), List.of("\"k1\",k2"))) {
            KeyHeader.KeyException e = assertThrows(KeyHeader.KeyException.class, () -> KeyHeader.parse(lines));
            assertEquals("idempotency-key-invalid", e.slug(), lines.toString());
            assertTrue(e.getMessage().contains("several"), lines + ": " + e.getMessage());
        }
    }
}
