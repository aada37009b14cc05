// The completion decision: status range, 5xx release, and the response size limit.
#include <gtest/gtest.h>

#include <cstdint>

#include "idem_core.h"

namespace {

constexpr std::uint64_t one_mb = 1048576;

IdemCompletion decide(std::int32_t status, std::uint64_t bytes = 10, std::uint64_t max = one_mb) {
    return idem_core_decide_completion(status, bytes, max);
}

}  // namespace

TEST(DecideCompletion, StatusBoundaries) {
    const struct {
        std::int32_t status;
        IdemCompletion expected;
    } cases[] = {
        {INT32_MIN, IDEM_COMPLETION_BAD_STATUS}, {-200, IDEM_COMPLETION_BAD_STATUS},
        {-1, IDEM_COMPLETION_BAD_STATUS},        {0, IDEM_COMPLETION_BAD_STATUS},
        {99, IDEM_COMPLETION_BAD_STATUS},        {100, IDEM_COMPLETION_STORE},
        {199, IDEM_COMPLETION_STORE},            {200, IDEM_COMPLETION_STORE},
        {201, IDEM_COMPLETION_STORE},            {402, IDEM_COMPLETION_STORE},
        {409, IDEM_COMPLETION_STORE},            {499, IDEM_COMPLETION_STORE},
        {500, IDEM_COMPLETION_RELEASE},          {503, IDEM_COMPLETION_RELEASE},
        {599, IDEM_COMPLETION_RELEASE},          {600, IDEM_COMPLETION_BAD_STATUS},
        {1000, IDEM_COMPLETION_BAD_STATUS},      {INT32_MAX, IDEM_COMPLETION_BAD_STATUS},
    };
    for (const auto& c : cases)
        EXPECT_EQ(decide(c.status), c.expected) << "status " << c.status;
}

TEST(DecideCompletion, SizeLimitIsInclusive) {
    EXPECT_EQ(decide(200, one_mb - 1), IDEM_COMPLETION_STORE);
    EXPECT_EQ(decide(200, one_mb), IDEM_COMPLETION_STORE);
    EXPECT_EQ(decide(200, one_mb + 1), IDEM_COMPLETION_TOO_LARGE);
    EXPECT_EQ(decide(200, 0), IDEM_COMPLETION_STORE);
}

TEST(DecideCompletion, SizeLimitExtremes) {
    EXPECT_EQ(decide(200, 0, 0), IDEM_COMPLETION_STORE);
    EXPECT_EQ(decide(200, 1, 0), IDEM_COMPLETION_TOO_LARGE);
    EXPECT_EQ(decide(200, UINT64_MAX, UINT64_MAX), IDEM_COMPLETION_STORE);
    EXPECT_EQ(decide(200, UINT64_MAX, UINT64_MAX - 1), IDEM_COMPLETION_TOO_LARGE);
}

TEST(DecideCompletion, SizeLimitAppliesToAllStoredStatuses) {
    for (std::int32_t status : {100, 199, 200, 302, 402, 499})
        EXPECT_EQ(decide(status, one_mb + 1), IDEM_COMPLETION_TOO_LARGE) << "status " << status;
}

// A 5xx is never stored, so its size is irrelevant: releasing must not fail with 54000.
TEST(DecideCompletion, ServerErrorIsReleasedEvenWhenTooLarge) {
    for (std::int32_t status : {500, 503, 599}) {
        EXPECT_EQ(decide(status, one_mb + 1), IDEM_COMPLETION_RELEASE) << "status " << status;
        EXPECT_EQ(decide(status, UINT64_MAX, 0), IDEM_COMPLETION_RELEASE) << "status " << status;
    }
}

// An invalid status is an invalid argument (22023) before any size question.
TEST(DecideCompletion, BadStatusWinsOverTooLarge) {
    EXPECT_EQ(decide(99, one_mb + 1), IDEM_COMPLETION_BAD_STATUS);
    EXPECT_EQ(decide(600, UINT64_MAX, 0), IDEM_COMPLETION_BAD_STATUS);
}
