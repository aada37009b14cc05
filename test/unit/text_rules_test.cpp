// Key and scope validation: lengths in bytes, and the control-character rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.hpp"

namespace {

IdemStatus key(const std::string& s) { return idem_core_validate_key(s.data(), s.size()); }
IdemStatus scope(const std::string& s) { return idem_core_validate_scope(s.data(), s.size()); }

// A control sequence at the start, in the middle and at the end of otherwise fine text.
std::vector<std::string> placements(const std::string& control) {
    return {control, control + "abc", "ab" + control + "c", "abc" + control};
}

// Keys and scopes share the character rule; each check runs against both.
void expect_both(const std::string& text, IdemStatus expected) {
    EXPECT_EQ(key(text), expected) << "key of " << text.size() << " bytes: " << hex_of(
        reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
    EXPECT_EQ(scope(text), expected) << "scope of " << text.size() << " bytes: " << hex_of(
        reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
}

}  // namespace

TEST(ValidateKey, EmptyIsRejected) {
    EXPECT_EQ(idem_core_validate_key(nullptr, 0), IDEM_ERR_EMPTY);
    EXPECT_EQ(key(""), IDEM_ERR_EMPTY);
}

TEST(ValidateKey, LengthLimitIn255Bytes) {
    EXPECT_EQ(key("a"), IDEM_OK);
    EXPECT_EQ(key(std::string(255, 'k')), IDEM_OK);
    EXPECT_EQ(key(std::string(256, 'k')), IDEM_ERR_TOO_LONG);
    EXPECT_EQ(key(std::string(100000, 'k')), IDEM_ERR_TOO_LONG);
}

// The limit counts bytes, not characters: 127 "é" + 1 byte = 255 bytes, 128 "é" = 256 bytes.
TEST(ValidateKey, LengthLimitCountsBytesOfMultibyteText) {
    std::string e_acute;
    for (int i = 0; i < 127; ++i)
        e_acute += "\xc3\xa9";
    EXPECT_EQ(key(e_acute + "k"), IDEM_OK);
    EXPECT_EQ(key(e_acute + "\xc3\xa9"), IDEM_ERR_TOO_LONG);
}

TEST(ValidateScope, EmptyIsAllowed) {
    EXPECT_EQ(idem_core_validate_scope(nullptr, 0), IDEM_OK);
    EXPECT_EQ(scope(""), IDEM_OK);
}

TEST(ValidateScope, LengthLimitIn255Bytes) {
    EXPECT_EQ(scope("s"), IDEM_OK);
    EXPECT_EQ(scope(std::string(255, 's')), IDEM_OK);
    EXPECT_EQ(scope(std::string(256, 's')), IDEM_ERR_TOO_LONG);
}

TEST(ValidateText, EveryC0ControlIsRejected) {
    for (int byte = 0x00; byte <= 0x1f; ++byte)
        for (const std::string& text : placements(std::string(1, static_cast<char>(byte))))
            expect_both(text, IDEM_ERR_CONTROL_CHAR);
}

TEST(ValidateText, DelIsRejected) {
    for (const std::string& text : placements("\x7f"))
        expect_both(text, IDEM_ERR_CONTROL_CHAR);
}

// U+0080..U+009F in UTF-8.
TEST(ValidateText, EveryUtf8C1ControlIsRejected) {
    for (int second = 0x80; second <= 0x9f; ++second)
        for (const std::string& text : placements(std::string("\xc2") + static_cast<char>(second)))
            expect_both(text, IDEM_ERR_CONTROL_CHAR);
}

TEST(ValidateText, PrintableAsciiBoundariesAreAccepted) {
    expect_both(" ", IDEM_OK);   // 0x20, first after C0
    expect_both("~", IDEM_OK);   // 0x7e, last before DEL
    expect_both("order-42/tenant:7 #1", IDEM_OK);
}

// Neighbours of the C1 range, and multibyte characters whose continuation bytes are 0x80..0x9f.
TEST(ValidateText, OtherUtf8IsAccepted) {
    expect_both("\xc2\xa0", IDEM_OK);          // U+00A0 no-break space, first after C1
    expect_both("\xc2\xbf", IDEM_OK);          // U+00BF
    expect_both("\xc3\x80", IDEM_OK);          // U+00C0 "À": C3, not C2, before 0x80
    expect_both("caf\xc3\xa9", IDEM_OK);       // "café"
    expect_both("\xe2\x82\xac", IDEM_OK);      // "€" E2 82 AC
    expect_both("\xf0\x9f\x98\x80", IDEM_OK);  // "😀" F0 9F 98 80
    expect_both("\xe4\xb8\xad\xe6\x96\x87", IDEM_OK);  // "中文"
    expect_both("\xc2\xc2\xa0", IDEM_OK);      // a C2 followed by C2 is not a control
}

// The character rule alone (1.2), which the PostgreSQL layer applies to text converted to UTF-8 from another
// server encoding: no length limit, the same controls.
TEST(CheckControls, SameControlsAsKeysWithoutLengthLimit) {
    auto check = [](const std::string& s) { return idem_core_check_controls(s.data(), s.size()); };
    EXPECT_EQ(check(""), IDEM_OK);
    EXPECT_EQ(check(std::string(1000, 'a')), IDEM_OK);
    EXPECT_EQ(check("caf\xc3\xa9"), IDEM_OK);
    for (int byte = 0; byte < 0x20; ++byte)
        EXPECT_EQ(check(std::string("ab") + static_cast<char>(byte)), IDEM_ERR_CONTROL_CHAR) << byte;
    EXPECT_EQ(check("a\x7f"), IDEM_ERR_CONTROL_CHAR);
    for (int second = 0x80; second <= 0x9f; ++second)
        EXPECT_EQ(check(std::string("next\xc2") + static_cast<char>(second)), IDEM_ERR_CONTROL_CHAR) << second;
}

// 1.4: stored response headers. A name is an RFC 9110 token; a value holds no control but HTAB.
namespace {

IdemStatus header_name(const std::string& s) { return idem_core_check_header_name(s.data(), s.size()); }
IdemStatus header_value(const std::string& s) { return idem_core_check_header_value(s.data(), s.size()); }

}  // namespace

TEST(HeaderName, TokensPass) {
    EXPECT_EQ(header_name("X-A"), IDEM_OK);
    EXPECT_EQ(header_name("Content-Type"), IDEM_OK);
    EXPECT_EQ(header_name("!#$%&'*+-.^_`|~09azAZ"), IDEM_OK);
}

TEST(HeaderName, EmptyAndNonTokenCharactersAreRejected) {
    EXPECT_EQ(idem_core_check_header_name(nullptr, 0), IDEM_ERR_EMPTY);
    EXPECT_EQ(header_name(""), IDEM_ERR_EMPTY);
    for (const char* bad : {" ", "\"", "(", ")", ",", "/", ":", ";", "<", "=", ">", "?", "@", "[", "\\", "]", "{",
                            "}", "\t", "\r", "\n", "\x7f", "\xc3\xa9"}) {
        for (const std::string& name : placements(bad))
            EXPECT_EQ(header_name(name), IDEM_ERR_NOT_TOKEN) << hex_of(
                reinterpret_cast<const std::uint8_t*>(name.data()), name.size());
    }
    EXPECT_EQ(header_name(std::string("X-A\0", 4)), IDEM_ERR_NOT_TOKEN);
}

TEST(HeaderValue, FieldContentPasses) {
    EXPECT_EQ(header_value(""), IDEM_OK);
    EXPECT_EQ(header_value("a b\tc"), IDEM_OK);
    EXPECT_EQ(header_value("\"quoted\", (comment); x=1 ~!@#$%^&*"), IDEM_OK);
    // obs-text: bytes from 0x80, as UTF-8 text has them.
    EXPECT_EQ(header_value("caf\xc3\xa9 \xc2\x85"), IDEM_OK);
}

TEST(HeaderValue, ControlsButTabAreRejected) {
    for (int byte = 0; byte < 0x20; ++byte) {
        if (byte == '\t')
            continue;
        for (const std::string& value : placements(std::string(1, static_cast<char>(byte))))
            EXPECT_EQ(header_value(value), IDEM_ERR_CONTROL_CHAR) << byte;
    }
    for (const std::string& value : placements("\x7f"))
        EXPECT_EQ(header_value(value), IDEM_ERR_CONTROL_CHAR);
    EXPECT_EQ(header_value("a\r\nSet-Cookie: x=1"), IDEM_ERR_CONTROL_CHAR);
}
