// 1.4 tombstones: a key whose response expired within idempotency.tombstone_ttl answers EXPIRED, never CLAIMED.
#include <gtest/gtest.h>

#include "idem_core.h"

namespace {

constexpr bool F = false, T = true;

// An expired completed row (not a lease), found with the lock granted: CLAIMED in 1.3.
IdemClaimFacts expired_completed_row(bool within_tombstone_ttl) {
    IdemClaimFacts facts{};
    facts.lock_granted = true;
    facts.row = IdemStoredRow{T, T, T, F, F, within_tombstone_ttl};
    return facts;
}

}  // namespace

TEST(DecideTombstone, ExpiredCompletedRowWithinTombstoneTtlIsExpired) {
    for (bool matches : {F, T})
        for (bool granted : {F, T}) {
            IdemClaimFacts facts = expired_completed_row(true);
            facts.row.hash_matches = matches;
            facts.lock_granted = granted;
            EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_EXPIRED) << matches << granted;
        }
}

TEST(DecideTombstone, PastTombstoneTtlIsClaimedAsIn13) {
    IdemClaimFacts facts = expired_completed_row(false);
    EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_CLAIMED);
}

TEST(DecideTombstone, TombstoneOfAnAbsentKeyIsExpired) {
    for (bool granted : {F, T}) {
        IdemClaimFacts facts{};
        facts.lock_granted = granted;
        facts.tombstone_found = true;
        EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_EXPIRED);
    }
}

// A lease that ran out without a completion is taken over, as in 1.3, even within the tombstone ttl.
TEST(DecideTombstone, ExpiredLeaseIsNotTombstoned) {
    IdemClaimFacts facts{};
    facts.lock_granted = true;
    facts.row = IdemStoredRow{T, T, T, T, F, T};
    EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_CLAIMED);
}

// Live rows answer from the row; this transaction's own claim stays IN_PROGRESS; a changed snapshot still fails.
TEST(DecideTombstone, OtherAnswersComeFirst) {
    IdemClaimFacts facts{};
    facts.lock_granted = true;
    facts.tombstone_found = true;
    facts.row = IdemStoredRow{T, F, T, F, F, F};
    EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_REPLAY);

    facts = expired_completed_row(true);
    facts.claimed_by_this_transaction = true;
    EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_IN_PROGRESS);

    facts = expired_completed_row(true);
    facts.row_changed_after_snapshot = true;
    EXPECT_EQ(idem_core_decide_claim(&facts), IDEM_OUTCOME_SERIALIZATION_FAILURE);
}

TEST(DecideTombstone, OutcomeName) {
    EXPECT_STREQ(idem_core_outcome_name(IDEM_OUTCOME_EXPIRED), "expired");
}
