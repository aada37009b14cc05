package dev.idempotency.servlet;

/**
 * Thrown by a scope function (authentication) to answer at once, before any claim: a 401, 403, ... The answer is
 * sent as it is (it is the application's, not the filter's: the error-shape renderer does not see it).
 */
public final class ProblemException extends RuntimeException {
    private final transient Answer answer;

    public ProblemException(Answer answer) {
        super("HTTP " + answer.status());
        this.answer = answer;
    }

    public Answer answer() {
        return answer;
    }
}
