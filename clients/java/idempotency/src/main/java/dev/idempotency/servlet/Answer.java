package dev.idempotency.servlet;

import java.util.ArrayList;
import java.util.List;

/**
 * An HTTP answer as the filter handles it: status, headers in order ({@code [name, value]}, the Content-Type among
 * them), body bytes. {@link #problem()} is set on the answers the filter writes itself (rule error-shape).
 */
public final class Answer {
    private final int status;
    private final List<String[]> headers;
    private final byte[] body;
    private final Problem problem;

    public Answer(int status, List<String[]> headers, byte[] body) {
        this(status, headers, body, null);
    }

    Answer(int status, List<String[]> headers, byte[] body, Problem problem) {
        this.status = status;
        this.headers = List.copyOf(headers);
        this.body = body == null ? new byte[0] : body;
        this.problem = problem;
    }

    public int status() {
        return status;
    }

    /** The headers, {@code [name, value]} pairs in order. */
    public List<String[]> headers() {
        return headers;
    }

    public byte[] body() {
        return body;
    }

    /** The problem this answer renders when the filter wrote it itself, else null. */
    public Problem problem() {
        return problem;
    }

    /** The first value of header {@code name} (case-insensitive), or null. */
    public String header(String name) {
        for (String[] h : headers) if (h[0].equalsIgnoreCase(name)) return h[1];
        return null;
    }

    /** This answer with one more header. */
    public Answer withHeader(String name, String value) {
        List<String[]> more = new ArrayList<>(headers);
        more.add(new String[] {name, value});
        return new Answer(status, more, body, problem == null ? null : problem.withHeader(name, value));
    }

    /** A JSON answer: {@code Content-Type: application/json}, then {@code more} headers ({@code name, value, ...}). */
    public static Answer json(int status, String json, String... more) {
        List<String[]> headers = new ArrayList<>();
        headers.add(new String[] {"Content-Type", "application/json"});
        for (int i = 0; i + 1 < more.length; i += 2) headers.add(new String[] {more[i], more[i + 1]});
        return new Answer(status, headers, json.getBytes(java.nio.charset.StandardCharsets.UTF_8));
    }
}
