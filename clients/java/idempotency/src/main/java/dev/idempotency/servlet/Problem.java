package dev.idempotency.servlet;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * An RFC 9457 problem: what the filter answers itself (400 key missing or invalid, 409 in progress, 410 expired,
 * 413 too large, 422 mismatch, 500), handed to the {@link Renderer} (rule error-shape). {@code type} is the problem
 * type's last segment ({@code idempotency-key-reused}); {@code headers} the ones the filter adds
 * ({@code Retry-After: 1} on 409).
 */
public record Problem(int status, String type, String title, String detail, Map<String, String> headers) {
    public static final String BASE = "https://idempotency.dev/problems/";

    public Problem {
        headers = Collections.unmodifiableMap(new LinkedHashMap<>(headers));
    }

    Problem withHeader(String name, String value) {
        Map<String, String> more = new LinkedHashMap<>(headers);
        more.put(name, value);
        return new Problem(status, type, title, detail, more);
    }

    /** Writes a problem as the API wants it: status, headers and body. */
    @FunctionalInterface
    public interface Renderer {
        Answer render(Problem problem);
    }

    /** The default renderer: {@code application/problem+json} {@code {"type", "title", "status", "detail"}}. */
    public static final Renderer PROBLEM_JSON = p -> p.toAnswer(BASE);

    /** This problem as {@code application/problem+json}, its type under {@code base}. */
    public Answer toAnswer(String base) {
        List<String[]> h = new ArrayList<>();
        h.add(new String[] {"Content-Type", "application/problem+json"});
        for (Map.Entry<String, String> e : headers.entrySet()) h.add(new String[] {e.getKey(), e.getValue()});
        String body = "{\"type\":" + Json.quote(base + type) + ",\"title\":" + Json.quote(title) + ",\"status\":"
                + status + ",\"detail\":" + Json.quote(detail) + "}";
        return new Answer(status, h, body.getBytes(StandardCharsets.UTF_8), this);
    }

    /** A problem+json answer (the default form), e.g. for a handler's own 401 or 404. */
    public static Answer answer(int status, String type, String title, String detail, String... headerPairs) {
        Map<String, String> h = new LinkedHashMap<>();
        for (int i = 0; i + 1 < headerPairs.length; i += 2) h.put(headerPairs[i], headerPairs[i + 1]);
        Answer a = new Problem(status, type, title, detail, h).toAnswer(BASE);
        return new Answer(a.status(), a.headers(), a.body());
    }

    /** The reason phrase of {@code status} (RFC 9110), or "Error". */
    public static String reason(int status) {
        return switch (status) {
            case 400 -> "Bad Request";
            case 401 -> "Unauthorized";
            case 402 -> "Payment Required";
            case 403 -> "Forbidden";
            case 404 -> "Not Found";
            case 405 -> "Method Not Allowed";
            case 406 -> "Not Acceptable";
            case 408 -> "Request Timeout";
            case 409 -> "Conflict";
            case 410 -> "Gone";
            case 411 -> "Length Required";
            case 412 -> "Precondition Failed";
            case 413 -> "Payload Too Large";
            case 415 -> "Unsupported Media Type";
            case 418 -> "I'm a Teapot";
            case 422 -> "Unprocessable Entity";
            case 423 -> "Locked";
            case 425 -> "Too Early";
            case 428 -> "Precondition Required";
            case 429 -> "Too Many Requests";
            case 500 -> "Internal Server Error";
            case 501 -> "Not Implemented";
            case 502 -> "Bad Gateway";
            case 503 -> "Service Unavailable";
            case 504 -> "Gateway Timeout";
            default -> "Error";
        };
    }
}
