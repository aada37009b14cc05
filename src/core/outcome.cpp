#include "outcome.hpp"

namespace idem::core {

namespace {

// A live stored response answers every later claim of its key.
IdemClaimOutcome answer_from_stored(const IdemStoredRow& row) {
    return row.hash_matches ? IDEM_OUTCOME_REPLAY : IDEM_OUTCOME_MISMATCH;
}

bool is_live(const IdemStoredRow& row) { return row.found && !row.expired; }

// 1.4: a completed key whose response expired less than idempotency.tombstone_ttl ago, as its row (not swept
// yet) or its tombstone shows it. A lease that ran out without a completion is no such key: it is taken over.
bool is_tombstoned(const IdemClaimFacts& facts) {
    if (facts.row.found)
        return facts.row.expired && !facts.row.leased && facts.row.within_tombstone_ttl;
    return facts.tombstone_found;
}

}  // namespace

IdemClaimOutcome decide_claim(const IdemClaimFacts& facts) {
    // This transaction is already running the request: a second claim must not run it again.
    if (facts.claimed_by_this_transaction)
        return IDEM_OUTCOME_IN_PROGRESS;
    if (is_live(facts.row)) {
        // A live stored response answers, whoever holds the lock (another replay may hold it briefly).
        if (!facts.row.leased)
            return answer_from_stored(facts.row);
        // A lease binds the key to its payload whether or not it has run out.
        if (!facts.row.hash_matches)
            return IDEM_OUTCOME_MISMATCH;
        // Its holder is still working on it (or has crashed and the lease has yet to run out).
        if (facts.row.lease_live)
            return IDEM_OUTCOME_IN_PROGRESS;
        // A lease that ran out is taken over like an absent key, below.
    }
    // The snapshot misses a completion or replacement: running the request could run it twice.
    if (facts.row_changed_after_snapshot)
        return IDEM_OUTCOME_SERIALIZATION_FAILURE;
    // A retry that comes after the response expired is never run again, whatever its payload and whoever
    // holds the key's lock (a session with tombstones off may be claiming it).
    if (is_tombstoned(facts))
        return IDEM_OUTCOME_EXPIRED;
    // Another transaction holds the key and has not ended: answer at once, never wait.
    return facts.lock_granted ? IDEM_OUTCOME_CLAIMED : IDEM_OUTCOME_IN_PROGRESS;
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
