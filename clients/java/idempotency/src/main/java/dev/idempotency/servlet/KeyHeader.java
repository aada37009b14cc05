package dev.idempotency.servlet;

import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * The Idempotency-Key request header (clients/CONTRACT.md): an RFC 8941 String ({@code "abc"}, with {@code \"} and
 * {@code \\} the only escapes) or the bare token form ({@code abc}), which mean the same key. Absent: slug
 * {@code idempotency-key-missing}; empty, unparsable, over 255 bytes, with control characters, or several keys (a
 * {@code ,} outside a quoted key, or the field on more than one line): {@code idempotency-key-invalid}.
 */
public final class KeyHeader {
    public static final int MAX_KEY_BYTES = 255;

    private KeyHeader() {}

    /** Why a key header was refused: {@link #slug()} is the problem type's last segment. */
    public static final class KeyException extends Exception {
        private final String slug;

        KeyException(String slug, String message) {
            super(message);
            this.slug = slug;
        }

        public String slug() {
            return slug;
        }

        public boolean missing() {
            return slug.equals("idempotency-key-missing");
        }
    }

    private static KeyException invalid(String message) {
        return new KeyException("idempotency-key-invalid", message);
    }

    private static KeyException severalKeys() {
        return invalid("the request has several Idempotency-Key values (a \",\" outside a quoted key, or the header "
                + "given more than once); send one key");
    }

    private static boolean isControl(char c) {
        return c < 0x20 || c == 0x7f || (c >= 0x80 && c <= 0x9f);
    }

    /** The key of the field's lines as the container gives them (one string a line; empty: the header is absent). */
    public static String parse(List<String> lines) throws KeyException {
        if (lines == null || lines.isEmpty()) {
            throw new KeyException("idempotency-key-missing", "the Idempotency-Key header is required");
        }
        if (lines.size() != 1) throw severalKeys();
        String value = strip(lines.get(0));
        if (value.isEmpty()) throw invalid("the Idempotency-Key header is empty");
        String key = value.charAt(0) == '"' ? parseString(value) : parseBare(value);
        if (key.isEmpty()) throw invalid("the Idempotency-Key header is empty");
        if (key.getBytes(StandardCharsets.UTF_8).length > MAX_KEY_BYTES) {
            throw invalid("the Idempotency-Key is over " + MAX_KEY_BYTES + " bytes");
        }
        return key;
    }

    private static String strip(String v) {
        int a = 0, b = v.length();
        while (a < b && (v.charAt(a) == ' ' || v.charAt(a) == '\t')) a++;
        while (b > a && (v.charAt(b - 1) == ' ' || v.charAt(b - 1) == '\t')) b--;
        return v.substring(a, b);
    }

    private static String parseString(String value) throws KeyException {
        StringBuilder out = new StringBuilder();
        int n = value.length();
        for (int i = 1; i < n; ) {
            char ch = value.charAt(i);
            if (ch == '\\') {
                if (i + 1 >= n) throw invalid("the Idempotency-Key ends inside an escape");
                char next = value.charAt(i + 1);
                if (next != '"' && next != '\\') throw invalid("the Idempotency-Key has an invalid escape");
                out.append(next);
                i += 2;
            } else if (ch == '"') {
                if (i + 1 != n) {
                    String rest = value.substring(i + 1).replaceFirst("^[ \t]*", "");
                    if (rest.startsWith(",")) throw severalKeys();
                    throw invalid("the Idempotency-Key has characters after its closing quote");
                }
                return out.toString();
            } else if (isControl(ch)) {
                throw invalid("the Idempotency-Key contains a control character");
            } else if (ch < 0x20 || ch > 0x7e) {
                throw invalid("the Idempotency-Key contains a character outside printable ASCII");
            } else {
                out.append(ch);
                i++;
            }
        }
        throw invalid("the Idempotency-Key has no closing quote");
    }

    private static String parseBare(String value) throws KeyException {
        if (value.indexOf(',') >= 0) throw severalKeys();
        for (int i = 0; i < value.length(); i++) {
            char c = value.charAt(i);
            if (isControl(c)) throw invalid("the Idempotency-Key contains a control character");
            if (c == '"') throw invalid("the Idempotency-Key has a quote inside a bare key");
            if (c < 0x21 || c > 0x7e) {
                throw invalid("a bare Idempotency-Key must be visible ASCII (quote a key with spaces)");
            }
        }
        return value;
    }
}
