// 1.4: the ttl, lease and wait spans as a fixed duration, whatever the caller's TimeZone: extract(epoch)'s count.
#include <gtest/gtest.h>

#include <cstdint>

#include "idem_core.h"

namespace {

constexpr int64_t usecs_per_hour = INT64_C(3600) * 1000000;
constexpr int64_t usecs_per_day = 24 * usecs_per_hour;

}  // namespace

TEST(FixedSpan, DayIs24Hours) {
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 1, 0), 24 * usecs_per_hour);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, -1, 0), -24 * usecs_per_hour);
    EXPECT_EQ(idem_core_fixed_span_usecs(usecs_per_hour, 1, 0), 25 * usecs_per_hour);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 3650, 0), 3650 * usecs_per_day);
}

TEST(FixedSpan, MonthIs30DaysAndYearIs365AndAQuarterDays) {
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, 1), 30 * usecs_per_day);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, 11), 330 * usecs_per_day);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, 12), 365 * usecs_per_day + 6 * usecs_per_hour);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, 13), 395 * usecs_per_day + 6 * usecs_per_hour);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, 120), 3652 * usecs_per_day + 12 * usecs_per_hour);
    // '-1 year +365 days -1 hour': 7 hours before now, not after it.
    EXPECT_EQ(idem_core_fixed_span_usecs(-usecs_per_hour, 365, -12), -7 * usecs_per_hour);
    // Months truncate toward zero into years, as extract(epoch) does: -13 months is -1 year - 1 month.
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, -13), -(395 * usecs_per_day + 6 * usecs_per_hour));
}

TEST(FixedSpan, SaturatesInsteadOfOverflowing) {
    EXPECT_EQ(idem_core_fixed_span_usecs(INT64_MAX, INT32_MAX, INT32_MAX), INT64_MAX);
    EXPECT_EQ(idem_core_fixed_span_usecs(INT64_MIN, INT32_MIN, INT32_MIN), INT64_MIN);
    EXPECT_EQ(idem_core_fixed_span_usecs(0, 0, INT32_MAX), INT64_MAX);
    EXPECT_EQ(idem_core_fixed_span_usecs(INT64_MAX, -1, 0), INT64_MAX - usecs_per_day);
    // Terms past int64 are summed exactly before saturating: 300000 years (over 2^63 microseconds alone) less as
    // many days of 365.25 is zero.
    EXPECT_EQ(idem_core_fixed_span_usecs(0, -109575000, 3600000), 0);
    EXPECT_EQ(idem_core_fixed_span_usecs(-INT64_C(2592000000000), 0, 1), 0);
}
