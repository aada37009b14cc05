// Messages and outcome names: the text the SQL layer shows and returns.
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>

#include "idem_core.h"

// Out-of-range probes use the largest value the enum can hold (15, 7): anything beyond is UB in C++.
namespace {

const IdemStatus all_statuses[] = {
    IDEM_OK,           IDEM_ERR_EMPTY,      IDEM_ERR_TOO_LONG, IDEM_ERR_CONTROL_CHAR, IDEM_ERR_HEX_LENGTH,
    IDEM_ERR_HEX_DIGIT, IDEM_ERR_STATUS_RANGE, IDEM_ERR_CRYPTO, IDEM_ERR_INTERNAL, IDEM_ERR_NOT_CANONICAL,
    IDEM_ERR_DATE_RANGE, IDEM_ERR_NOT_TOKEN,
};

const IdemClaimOutcome all_outcomes[] = {
    IDEM_OUTCOME_CLAIMED,     IDEM_OUTCOME_REPLAY,     IDEM_OUTCOME_MISMATCH,
    IDEM_OUTCOME_IN_PROGRESS, IDEM_OUTCOME_SERIALIZATION_FAILURE,
};

}  // namespace

TEST(StatusMessage, EveryStatusHasItsOwnText) {
    const std::string fallback = idem_core_status_message(static_cast<IdemStatus>(15));
    std::set<std::string> seen;
    for (IdemStatus status : all_statuses) {
        const char* message = idem_core_status_message(status);
        ASSERT_NE(message, nullptr) << status;
        EXPECT_GT(std::strlen(message), 0u) << status;
        EXPECT_NE(message, fallback) << status;
        seen.insert(message);
    }
    EXPECT_EQ(seen.size(), std::size(all_statuses));
}

TEST(StatusMessage, UnknownValueStillGivesText) {
    const char* message = idem_core_status_message(static_cast<IdemStatus>(15));
    ASSERT_NE(message, nullptr);
    EXPECT_GT(std::strlen(message), 0u);
}

TEST(OutcomeName, EveryOutcomeHasItsOwnName) {
    const std::string fallback = idem_core_outcome_name(static_cast<IdemClaimOutcome>(7));
    std::set<std::string> seen;
    for (IdemClaimOutcome outcome : all_outcomes) {
        const char* name = idem_core_outcome_name(outcome);
        ASSERT_NE(name, nullptr) << outcome;
        EXPECT_GT(std::strlen(name), 0u) << outcome;
        EXPECT_NE(name, fallback) << outcome;
        seen.insert(name);
    }
    EXPECT_EQ(seen.size(), std::size(all_outcomes));
}

// idem_claim returns these strings in its outcome column: they are API.
TEST(OutcomeName, SqlVisibleNames) {
    EXPECT_STREQ(idem_core_outcome_name(IDEM_OUTCOME_CLAIMED), "claimed");
    EXPECT_STREQ(idem_core_outcome_name(IDEM_OUTCOME_REPLAY), "replay");
    EXPECT_STREQ(idem_core_outcome_name(IDEM_OUTCOME_MISMATCH), "mismatch");
    EXPECT_STREQ(idem_core_outcome_name(IDEM_OUTCOME_IN_PROGRESS), "in_progress");
}

TEST(OutcomeName, UnknownValueStillGivesText) {
    const char* name = idem_core_outcome_name(static_cast<IdemClaimOutcome>(7));
    ASSERT_NE(name, nullptr);
    EXPECT_GT(std::strlen(name), 0u);
}
