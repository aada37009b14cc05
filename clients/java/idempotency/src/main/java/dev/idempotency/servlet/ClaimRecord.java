package dev.idempotency.servlet;

import java.io.ByteArrayOutputStream;
import java.util.ArrayList;
import java.util.List;

/**
 * The claim's value, {@code idem_request_claim}, read in its text form whatever the session's settings (rule
 * session-settings): the record literal {@code (f1,f2,...)} (an empty unquoted field is NULL; inside quotes
 * {@code ""} is {@code "} and a backslash escapes the next character), and the body's bytea text in either form
 * {@code bytea_output} gives: hex ({@code \x...}) or escape (printable ASCII as itself, {@code \\}, {@code \ooo}).
 * {@code headers} is the stored headers of a replay and, from 1.4, the headers the answer carries for the other
 * outcomes (rule key-lifetime: {@code Idempotency-Key-Expires}).
 */
public record ClaimRecord(String outcome, Integer httpStatus, String contentType, String headers, byte[] body) {

    public static ClaimRecord parse(String text) {
        List<String> f = fields(text);
        if (f.size() < 5) throw new IllegalArgumentException("idem_request_claim has " + f.size() + " fields");
        return new ClaimRecord(f.get(0), f.get(1) == null ? null : Integer.valueOf(f.get(1)), f.get(2), f.get(3),
                f.get(4) == null ? null : bytea(f.get(4)));
    }

    /** The fields of a record literal; null for an empty unquoted field. */
    public static List<String> fields(String text) {
        if (text == null || text.length() < 2 || text.charAt(0) != '(' || text.charAt(text.length() - 1) != ')') {
            throw new IllegalArgumentException("not a record literal");
        }
        List<String> out = new ArrayList<>();
        int i = 1;
        int n = text.length();
        while (i < n) {
            if (text.charAt(i) == '"') {
                StringBuilder v = new StringBuilder();
                for (i++; i < n; i++) {
                    char c = text.charAt(i);
                    if (c == '\\') {
                        v.append(text.charAt(++i));
                    } else if (c == '"' && i + 1 < n && text.charAt(i + 1) == '"') {
                        v.append('"');
                        i++;
                    } else if (c == '"') {
                        break;
                    } else {
                        v.append(c);
                    }
                }
                out.add(v.toString());
                i++;
            } else {
                int end = i;
                while (end < n && text.charAt(end) != ',' && text.charAt(end) != ')') end++;
                out.add(end == i ? null : text.substring(i, end));
                i = end;
            }
            i++; // the ',' or ')'
        }
        return out;
    }

    /** The bytes of bytea's text form, hex or escape; IllegalArgumentException on anything else. */
    public static byte[] bytea(String text) {
        if (text.startsWith("\\x")) {
            int n = (text.length() - 2) / 2;
            if ((text.length() - 2) % 2 != 0) throw new IllegalArgumentException("malformed bytea text (hex)");
            byte[] out = new byte[n];
            for (int k = 0; k < n; k++) {
                int hi = Character.digit(text.charAt(2 + 2 * k), 16);
                int lo = Character.digit(text.charAt(3 + 2 * k), 16);
                if (hi < 0 || lo < 0) throw new IllegalArgumentException("malformed bytea text (hex)");
                out[k] = (byte) (hi << 4 | lo);
            }
            return out;
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream(text.length());
        for (int k = 0; k < text.length(); ) {
            char c = text.charAt(k);
            if (c != '\\') {
                if (c < 0x20 || c > 0x7e) throw new IllegalArgumentException("malformed bytea text (escape)");
                out.write(c);
                k++;
            } else if (k + 1 < text.length() && text.charAt(k + 1) == '\\') {
                out.write('\\');
                k += 2;
            } else {
                if (k + 4 > text.length() || !text.substring(k + 1, k + 4).matches("[0-3][0-7][0-7]")) {
                    throw new IllegalArgumentException("malformed bytea text (escape)");
                }
                out.write(Integer.parseInt(text.substring(k + 1, k + 4), 8));
                k += 4;
            }
        }
        return out.toByteArray();
    }
}
