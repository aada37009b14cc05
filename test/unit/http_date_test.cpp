// HTTP-dates (rule key-lifetime): Unix seconds to an RFC 9110 IMF-fixdate, at the edges of the calendar.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>

#include "idem_core.h"

namespace {

std::string date(std::int64_t seconds) {
    char out[IDEM_HTTP_DATE_CHARS];
    const IdemStatus status = idem_core_http_date(seconds, out);
    if (status != IDEM_OK)
        return "status " + std::to_string(status);
    return std::string(out, sizeof out);
}

}  // namespace

TEST(HttpDate, Epoch) {
    EXPECT_EQ(date(0), "Thu, 01 Jan 1970 00:00:00 GMT");
    EXPECT_EQ(date(86399), "Thu, 01 Jan 1970 23:59:59 GMT");
    EXPECT_EQ(date(86400), "Fri, 02 Jan 1970 00:00:00 GMT");
}

TEST(HttpDate, TheContractsExample) {
    EXPECT_EQ(date(1796725800), "Tue, 08 Dec 2026 10:30:00 GMT");
    // RFC 9110's own example
    EXPECT_EQ(date(784111777), "Sun, 06 Nov 1994 08:49:37 GMT");
}

TEST(HttpDate, LeapDays) {
    EXPECT_EQ(date(951782400), "Tue, 29 Feb 2000 00:00:00 GMT");  // divisible by 400: a leap year
    EXPECT_EQ(date(951868800), "Wed, 01 Mar 2000 00:00:00 GMT");
    EXPECT_EQ(date(1709251199), "Thu, 29 Feb 2024 23:59:59 GMT");
    EXPECT_EQ(date(1709251200), "Fri, 01 Mar 2024 00:00:00 GMT");
    EXPECT_EQ(date(4107542400), "Mon, 01 Mar 2100 00:00:00 GMT");  // 2100 is not a leap year: 28 Feb, then 1 Mar
    EXPECT_EQ(date(4107542399), "Sun, 28 Feb 2100 23:59:59 GMT");
    EXPECT_EQ(date(978220800), "Sun, 31 Dec 2000 00:00:00 GMT");   // day 366 of a leap year
}

TEST(HttpDate, EveryMonthsName) {
    const char* expected[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    // the 15th of each month of 2026, 00:00:00 GMT
    const std::int64_t fifteenth[] = {1768435200, 1771113600, 1773532800, 1776211200, 1778803200, 1781481600,
                                      1784073600, 1786752000, 1789430400, 1792022400, 1794700800, 1797292800};
    for (int m = 0; m < 12; ++m)
        EXPECT_EQ(date(fifteenth[m]).substr(5, 11), std::string("15 ") + expected[m] + " 2026") << m;
}

TEST(HttpDate, YearNineThousandNineHundredNinetyNine) {
    EXPECT_EQ(date(253402300799), "Fri, 31 Dec 9999 23:59:59 GMT");
    EXPECT_EQ(date(253402300800), "status " + std::to_string(IDEM_ERR_DATE_RANGE));
    EXPECT_EQ(date(INT64_MAX), "status " + std::to_string(IDEM_ERR_DATE_RANGE));
}

TEST(HttpDate, NegativeRefusedOutputUntouched) {
    char out[IDEM_HTTP_DATE_CHARS];
    std::fill(std::begin(out), std::end(out), '#');
    EXPECT_EQ(idem_core_http_date(-1, out), IDEM_ERR_DATE_RANGE);
    EXPECT_EQ(idem_core_http_date(INT64_MIN, out), IDEM_ERR_DATE_RANGE);
    EXPECT_EQ(std::string(out, sizeof out), std::string(IDEM_HTTP_DATE_CHARS, '#'));
}
