#include "http_date.hpp"

namespace idem::core {

namespace {

constexpr char day_names[7][4] = {"Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"};  // from 1970-01-01, a Thursday
constexpr char month_names[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// The proleptic Gregorian date of a day counted from 1970-01-01 (days >= 0): the era algorithm, eras of 400
// years (146097 days) starting on March 1st, so the leap day is the last day of its year.
void civil_from_days(std::int64_t days, std::int64_t& year, int& month, int& day) {
    const std::int64_t z = days + 719468;  // days since 0000-03-01
    const std::int64_t era = z / 146097;
    const std::int64_t doe = z - era * 146097;                                  // [0, 146096]
    const std::int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  // [0, 399]
    const std::int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);          // [0, 365]
    const std::int64_t mp = (5 * doy + 2) / 153;                                // [0, 11], March = 0
    day = static_cast<int>(doy - (153 * mp + 2) / 5 + 1);
    month = static_cast<int>(mp < 10 ? mp + 3 : mp - 9);
    year = yoe + era * 400 + (month <= 2 ? 1 : 0);
}

void put2(char* at, int value) {
    at[0] = static_cast<char>('0' + value / 10);
    at[1] = static_cast<char>('0' + value % 10);
}

void put3(char* at, const char name[4]) {
    at[0] = name[0];
    at[1] = name[1];
    at[2] = name[2];
}

}  // namespace

IdemStatus format_http_date(std::int64_t unix_seconds, char out[IDEM_HTTP_DATE_CHARS]) {
    if (unix_seconds < 0 || unix_seconds > http_date_max_seconds)
        return IDEM_ERR_DATE_RANGE;
    const std::int64_t days = unix_seconds / 86400;
    const int seconds_of_day = static_cast<int>(unix_seconds % 86400);
    std::int64_t year = 0;
    int month = 0;
    int day = 0;
    civil_from_days(days, year, month, day);

    // "Www, DD Mmm YYYY HH:MM:SS GMT"
    char* p = out;
    put3(p, day_names[days % 7]);
    p[3] = ',';
    p[4] = ' ';
    put2(p + 5, day);
    p[7] = ' ';
    put3(p + 8, month_names[month - 1]);
    p[11] = ' ';
    put2(p + 12, static_cast<int>(year / 100));
    put2(p + 14, static_cast<int>(year % 100));
    p[16] = ' ';
    put2(p + 17, seconds_of_day / 3600);
    p[19] = ':';
    put2(p + 20, seconds_of_day / 60 % 60);
    p[22] = ':';
    put2(p + 23, seconds_of_day % 60);
    p[25] = ' ';
    p[26] = 'G';
    p[27] = 'M';
    p[28] = 'T';
    return IDEM_OK;
}

}  // namespace idem::core
