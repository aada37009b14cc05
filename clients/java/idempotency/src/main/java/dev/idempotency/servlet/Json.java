package dev.idempotency.servlet;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The little JSON the filter needs (RFC 8259), with no dependency: a parser whose objects are
 * {@code LinkedHashMap}s (member order kept; a repeated name keeps its first place and takes the last value, as
 * JavaScript's JSON.parse),
 * arrays {@code List}s, strings {@code String}s, numbers {@link Num} (the number's text as written, so
 * {@code 1e2}, {@code 1.0} and {@code 100} stay apart), {@code Boolean} and {@link #NULL}; and a compact writer,
 * the form JavaScript's JSON.stringify gives.
 */
public final class Json {
    /** JSON's null (a member whose value is null is not a missing member). */
    public static final Object NULL = new Object() {
        @Override
        public String toString() {
            return "null";
        }
    };

    /** A JSON number, as written. */
    public record Num(String text) {}

    private final String s;
    private int i;

    private Json(String s) {
        this.s = s;
    }

    /** The value of JSON text {@code text}; IllegalArgumentException when it is not one JSON text. */
    public static Object parse(String text) {
        Json p = new Json(text);
        p.ws();
        Object v = p.value(0);
        p.ws();
        if (p.i != text.length()) throw p.error("text after the JSON value");
        return v;
    }

    private IllegalArgumentException error(String what) {
        return new IllegalArgumentException("not JSON: " + what + " at " + i);
    }

    private void ws() {
        while (i < s.length()) {
            char c = s.charAt(i);
            if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
            i++;
        }
    }

    private Object value(int depth) {
        if (depth > 512) throw error("nested too deep");
        if (i >= s.length()) throw error("end of text");
        char c = s.charAt(i);
        switch (c) {
            case '{': {
                i++;
                Map<String, Object> m = new LinkedHashMap<>();
                ws();
                if (i < s.length() && s.charAt(i) == '}') {
                    i++;
                    return m;
                }
                while (true) {
                    ws();
                    if (i >= s.length() || s.charAt(i) != '"') throw error("a member name");
                    String k = string();
                    ws();
                    if (i >= s.length() || s.charAt(i) != ':') throw error("':'");
                    i++;
                    ws();
                    Object v = value(depth + 1);
                    m.put(k, v); // a repeated name keeps its first place and takes the last value, as JSON.parse
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    if (i < s.length() && s.charAt(i) == '}') {
                        i++;
                        return m;
                    }
                    throw error("',' or '}'");
                }
            }
            case '[': {
                i++;
                List<Object> l = new ArrayList<>();
                ws();
                if (i < s.length() && s.charAt(i) == ']') {
                    i++;
                    return l;
                }
                while (true) {
                    ws();
                    l.add(value(depth + 1));
                    ws();
                    if (i < s.length() && s.charAt(i) == ',') {
                        i++;
                        continue;
                    }
                    if (i < s.length() && s.charAt(i) == ']') {
                        i++;
                        return l;
                    }
                    throw error("',' or ']'");
                }
            }
            case '"':
                return string();
            case 't':
                return literal("true", Boolean.TRUE);
            case 'f':
                return literal("false", Boolean.FALSE);
            case 'n':
                return literal("null", NULL);
            default:
                return number();
        }
    }

    private Object literal(String word, Object v) {
        if (!s.startsWith(word, i)) throw error("a value");
        i += word.length();
        return v;
    }

    private Num number() {
        int start = i;
        if (i < s.length() && s.charAt(i) == '-') i++;
        if (i < s.length() && s.charAt(i) == '0') {
            i++;
        } else if (i < s.length() && s.charAt(i) >= '1' && s.charAt(i) <= '9') {
            while (i < s.length() && Character.isDigit(s.charAt(i)) && s.charAt(i) < 128) i++;
        } else {
            throw error("a value");
        }
        if (i < s.length() && s.charAt(i) == '.') {
            i++;
            int d = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            if (d == i) throw error("a digit");
        }
        if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
            i++;
            if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) i++;
            int d = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            if (d == i) throw error("a digit");
        }
        return new Num(s.substring(start, i));
    }

    private String string() {
        i++; // the opening quote
        StringBuilder b = new StringBuilder();
        while (true) {
            if (i >= s.length()) throw error("an unterminated string");
            char c = s.charAt(i++);
            if (c == '"') return b.toString();
            if (c < 0x20) throw error("a control character in a string");
            if (c != '\\') {
                b.append(c);
                continue;
            }
            if (i >= s.length()) throw error("an unterminated escape");
            char e = s.charAt(i++);
            switch (e) {
                case '"', '\\', '/' -> b.append(e);
                case 'b' -> b.append('\b');
                case 'f' -> b.append('\f');
                case 'n' -> b.append('\n');
                case 'r' -> b.append('\r');
                case 't' -> b.append('\t');
                case 'u' -> {
                    if (i + 4 > s.length()) throw error("a \\u escape");
                    try {
                        b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                    } catch (NumberFormatException x) {
                        throw error("a \\u escape");
                    }
                    if (!s.substring(i, i + 4).matches("[0-9a-fA-F]{4}")) throw error("a \\u escape");
                    i += 4;
                }
                default -> throw error("an escape");
            }
        }
    }

    /** {@code v} (as {@link #parse} gives values, or any Map, List, String, Number, Boolean) as compact JSON text. */
    public static String write(Object v) {
        StringBuilder b = new StringBuilder();
        write(b, v);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v) {
        if (v == null || v == NULL) {
            b.append("null");
        } else if (v instanceof String str) {
            b.append(quote(str));
        } else if (v instanceof Num n) {
            b.append(n.text());
        } else if (v instanceof Number || v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!first) b.append(',');
                first = false;
                b.append(quote(String.valueOf(e.getKey()))).append(':');
                write(b, e.getValue());
            }
            b.append('}');
        } else if (v instanceof List<?> l) {
            b.append('[');
            for (int k = 0; k < l.size(); k++) {
                if (k > 0) b.append(',');
                write(b, l.get(k));
            }
            b.append(']');
        } else {
            throw new IllegalArgumentException("not a JSON value: " + v.getClass());
        }
    }

    /** {@code str} as a JSON string, escaped as JSON.stringify does (lone surrogates as \\u escapes). */
    public static String quote(String str) {
        StringBuilder b = new StringBuilder(str.length() + 2).append('"');
        for (int k = 0; k < str.length(); k++) {
            char c = str.charAt(k);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\b' -> b.append("\\b");
                case '\f' -> b.append("\\f");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    boolean lone = Character.isHighSurrogate(c)
                            ? !(k + 1 < str.length() && Character.isLowSurrogate(str.charAt(k + 1)))
                            : Character.isLowSurrogate(c) && !(k > 0 && Character.isHighSurrogate(str.charAt(k - 1)));
                    if (c < 0x20 || lone) b.append(String.format("\\u%04x", (int) c));
                    else b.append(c);
                }
            }
        }
        return b.append('"').toString();
    }
}
