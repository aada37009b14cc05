#include "outcome.hpp"

namespace idem::core {

namespace {

// A live stored response answers every later claim of its key.
IdemClaimOutcome answer_from_stored(const IdemStoredRow& row) {
    return row.hash_matches ? IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_MISMATCH;
}

bool is_live(const IdemStoredRow& row) { return row.found && !row.expired; }

}  // namespace

IdemClaimOutcome decide_claim(const IdemClaimFacts& facts) {
    // This transaction is already running the request: a second claim must not run it again.
    if (facts.claimed_by_this_transaction)
        return IDEM_OUTCOME_IN_PROGRESS;

    if (!facts.lock_tried) {
        // The first look uses the caller's snapshot; only a miss needs the lock.
        if (is_live(facts.row))
            return answer_from_stored(facts.row);
        return IDEM_OUTCOME_NEEDS_LOCK;
    }

    // Another transaction holds the key and has not ended: answer at once, never wait.
    if (!facts.lock_granted)
        return IDEM_OUTCOME_IN_PROGRESS;

    // With the lock, the second look sees every committed completion.
    if (is_live(facts.row)) {
        // The caller's snapshot missed that completion; running the request would run it twice.
        if (facts.transaction_snapshot)
            return IDEM_OUTCOME_SERIALIZATION_FAILURE;
        return answer_from_stored(facts.row);
    }
    return IDEM_OUTCOME_CLAIMED;
}

bool is_valid_http_status(std::int32_t http_status) {
    return http_status >= 100 && http_status <= 599;
}

IdemCompletion decide_completion(std::int32_t http_status, std::uint64_t response_bytes,
                                 std::uint64_t max_response_bytes) {
    if (!is_valid_http_status(http_status))
        return IDEM_COMPLETION_BAD_STATUS;
    // Technical failures are never cached: the client must be able to retry.
    if (http_status >= 500)
        return IDEM_COMPLETION_RELEASE;
    if (response_bytes > max_response_bytes)
        return IDEM_COMPLETION_TOO_LARGE;
    return IDEM_COMPLETION_STORE;
}

}  // namespace idem::core
