// The claim decision: every combination of IdemClaimFacts, with its outcome written out by hand.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "idem_core.h"

namespace {

constexpr bool F = false, T = true;
constexpr IdemClaimOutcome CLAIMED = IDEM_OUTCOME_CLAIMED, REPLAY = IDEM_OUTCOME_REPLAY,
                           MISMATCH = IDEM_OUTCOME_MISMATCH, IN_PROGRESS = IDEM_OUTCOME_IN_PROGRESS,
                           SERIALIZE = IDEM_OUTCOME_SERIALIZATION_FAILURE;

// The 1.0 facts of a row; the lease facts (leased, lease_live) are false here: see LeaseRows.
struct Stored {
    bool found, expired, hash_matches;
};

struct Row {
    bool claimed_by_this_transaction, lock_granted, row_changed_after_snapshot;
    Stored row;
    IdemClaimOutcome expected;
};

// Reading guide: a row is live when found and not expired.
//  - this transaction holds the key: IN_PROGRESS, whatever else;
//  - a live row answers REPLAY or MISMATCH, whoever holds the lock;
//  - no live row, but the latest snapshot differs from the caller's: SERIALIZE (even if the lock is busy);
//  - otherwise CLAIMED with the lock, IN_PROGRESS without it.
const std::vector<Row> truth_table = {
    // claimed, granted, changed, {found, expired, matches}, outcome
    {F, F, F, {F, F, F}, IN_PROGRESS},
    {F, F, F, {F, F, T}, IN_PROGRESS},
    {F, F, F, {F, T, F}, IN_PROGRESS},
    {F, F, F, {F, T, T}, IN_PROGRESS},
    {F, F, F, {T, F, F}, MISMATCH},
    {F, F, F, {T, F, T}, REPLAY},
    {F, F, F, {T, T, F}, IN_PROGRESS},
    {F, F, F, {T, T, T}, IN_PROGRESS},
    {F, F, T, {F, F, F}, SERIALIZE},
    {F, F, T, {F, F, T}, SERIALIZE},
    {F, F, T, {F, T, F}, SERIALIZE},
    {F, F, T, {F, T, T}, SERIALIZE},
    {F, F, T, {T, F, F}, MISMATCH},
    {F, F, T, {T, F, T}, REPLAY},
    {F, F, T, {T, T, F}, SERIALIZE},
    {F, F, T, {T, T, T}, SERIALIZE},
    {F, T, F, {F, F, F}, CLAIMED},
    {F, T, F, {F, F, T}, CLAIMED},
    {F, T, F, {F, T, F}, CLAIMED},
    {F, T, F, {F, T, T}, CLAIMED},
    {F, T, F, {T, F, F}, MISMATCH},
    {F, T, F, {T, F, T}, REPLAY},
    {F, T, F, {T, T, F}, CLAIMED},
    {F, T, F, {T, T, T}, CLAIMED},
    {F, T, T, {F, F, F}, SERIALIZE},
    {F, T, T, {F, F, T}, SERIALIZE},
    {F, T, T, {F, T, F}, SERIALIZE},
    {F, T, T, {F, T, T}, SERIALIZE},
    {F, T, T, {T, F, F}, MISMATCH},
    {F, T, T, {T, F, T}, REPLAY},
    {F, T, T, {T, T, F}, SERIALIZE},
    {F, T, T, {T, T, T}, SERIALIZE},
    {T, F, F, {F, F, F}, IN_PROGRESS},
    {T, F, F, {F, F, T}, IN_PROGRESS},
    {T, F, F, {F, T, F}, IN_PROGRESS},
    {T, F, F, {F, T, T}, IN_PROGRESS},
    {T, F, F, {T, F, F}, IN_PROGRESS},
    {T, F, F, {T, F, T}, IN_PROGRESS},
    {T, F, F, {T, T, F}, IN_PROGRESS},
    {T, F, F, {T, T, T}, IN_PROGRESS},
    {T, F, T, {F, F, F}, IN_PROGRESS},
    {T, F, T, {F, F, T}, IN_PROGRESS},
    {T, F, T, {F, T, F}, IN_PROGRESS},
    {T, F, T, {F, T, T}, IN_PROGRESS},
    {T, F, T, {T, F, F}, IN_PROGRESS},
    {T, F, T, {T, F, T}, IN_PROGRESS},
    {T, F, T, {T, T, F}, IN_PROGRESS},
    {T, F, T, {T, T, T}, IN_PROGRESS},
    {T, T, F, {F, F, F}, IN_PROGRESS},
    {T, T, F, {F, F, T}, IN_PROGRESS},
    {T, T, F, {F, T, F}, IN_PROGRESS},
    {T, T, F, {F, T, T}, IN_PROGRESS},
    {T, T, F, {T, F, F}, IN_PROGRESS},
    {T, T, F, {T, F, T}, IN_PROGRESS},
    {T, T, F, {T, T, F}, IN_PROGRESS},
    {T, T, F, {T, T, T}, IN_PROGRESS},
    {T, T, T, {F, F, F}, IN_PROGRESS},
    {T, T, T, {F, F, T}, IN_PROGRESS},
    {T, T, T, {F, T, F}, IN_PROGRESS},
    {T, T, T, {F, T, T}, IN_PROGRESS},
    {T, T, T, {T, F, F}, IN_PROGRESS},
    {T, T, T, {T, F, T}, IN_PROGRESS},
    {T, T, T, {T, T, F}, IN_PROGRESS},
    {T, T, T, {T, T, T}, IN_PROGRESS},
};

IdemClaimFacts facts_of(const Row& r) {
    IdemClaimFacts facts{};
    facts.claimed_by_this_transaction = r.claimed_by_this_transaction;
    facts.lock_granted = r.lock_granted;
    facts.row_changed_after_snapshot = r.row_changed_after_snapshot;
    facts.row.found = r.row.found;
    facts.row.expired = r.row.expired;
    facts.row.hash_matches = r.row.hash_matches;
    return facts;
}

}  // namespace

// Guards the table itself: 2^6 distinct combinations, none missing, none twice.
TEST(DecideClaim, TruthTableCoversEveryCombination) {
    std::set<int> seen;
    for (const Row& r : truth_table)
        seen.insert(r.claimed_by_this_transaction << 5 | r.lock_granted << 4 | r.row_changed_after_snapshot << 3 |
                    r.row.found << 2 | r.row.expired << 1 | r.row.hash_matches);
    EXPECT_EQ(truth_table.size(), 64u);
    EXPECT_EQ(seen.size(), 64u);
}

TEST(DecideClaim, TruthTable) {
    for (std::size_t i = 0; i < truth_table.size(); ++i) {
        const Row& r = truth_table[i];
        const IdemClaimFacts facts = facts_of(r);
        EXPECT_EQ(idem_core_decide_claim(&facts), r.expected)
            << "row " << i << ": claimed=" << r.claimed_by_this_transaction << " granted=" << r.lock_granted
            << " changed=" << r.row_changed_after_snapshot << " found=" << r.row.found
            << " expired=" << r.row.expired << " matches=" << r.row.hash_matches
            << " expected " << idem_core_outcome_name(r.expected);
    }
}

// Lease mode: a live row that is a lease. found=T, expired=F; {leased, lease_live, matches} x lock x changed.
TEST(DecideClaim, LeaseRows) {
    struct LeaseRow {
        bool lock_granted, changed, lease_live, hash_matches;
        IdemClaimOutcome expected;
    };
    const std::vector<LeaseRow> table = {
        // granted, changed, live, matches
        {F, F, F, F, MISMATCH},    {F, F, F, T, IN_PROGRESS}, {F, F, T, F, MISMATCH},
        {F, F, T, T, IN_PROGRESS}, {F, T, F, F, MISMATCH},    {F, T, F, T, SERIALIZE},
        {F, T, T, F, MISMATCH},    {F, T, T, T, IN_PROGRESS}, {T, F, F, F, MISMATCH},
        {T, F, F, T, CLAIMED},     {T, F, T, F, MISMATCH},    {T, F, T, T, IN_PROGRESS},
        {T, T, F, F, MISMATCH},    {T, T, F, T, SERIALIZE},   {T, T, T, F, MISMATCH},
        {T, T, T, T, IN_PROGRESS},
    };
    for (std::size_t i = 0; i < table.size(); ++i) {
        const LeaseRow& r = table[i];
        IdemClaimFacts facts{};
        facts.lock_granted = r.lock_granted;
        facts.row_changed_after_snapshot = r.changed;
        facts.row = IdemStoredRow{T, F, r.hash_matches, T, r.lease_live, F};
        EXPECT_EQ(idem_core_decide_claim(&facts), r.expected) << "lease row " << i;
        // This transaction holding the key wins over any lease.
        facts.claimed_by_this_transaction = true;
        EXPECT_EQ(idem_core_decide_claim(&facts), IN_PROGRESS) << "lease row " << i;
    }
}

// An expired lease is an expired row: claimed with the lock, whatever its payload.
TEST(DecideClaim, ExpiredLeaseIsAbsent) {
    IdemClaimFacts facts{};
    facts.lock_granted = true;
    facts.row = IdemStoredRow{T, T, F, T, T, F};
    EXPECT_EQ(idem_core_decide_claim(&facts), CLAIMED);
}
