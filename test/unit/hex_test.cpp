// Parsing of 64-digit request hashes and lowercase hex output.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <string>

#include "test_support.hpp"

namespace {

const std::string abc_lower = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
const std::string hex_digits = "0123456789abcdefABCDEF";

IdemStatus parse(const std::string& hex, Digest& out) {
    return idem_core_parse_sha256_hex(hex.data(), hex.size(), out.data());
}

std::string to_hex(const Digest& d) {
    char out[IDEM_SHA256_HEX_CHARS];
    idem_core_sha256_to_hex(d.data(), out);
    return std::string(out, sizeof out);
}

std::string upper(std::string s) {
    for (char& c : s)
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

}  // namespace

TEST(HexParse, Lowercase) {
    Digest d{};
    ASSERT_EQ(parse(abc_lower, d), IDEM_OK);
    EXPECT_EQ(d, digest_from_hex(abc_lower));
}

TEST(HexParse, Uppercase) {
    Digest d{};
    ASSERT_EQ(parse(upper(abc_lower), d), IDEM_OK);
    EXPECT_EQ(d, digest_from_hex(abc_lower));
}

TEST(HexParse, MixedCase) {
    std::string mixed = abc_lower;
    for (std::size_t i = 0; i < mixed.size(); i += 2)
        mixed[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(mixed[i])));
    Digest d{};
    ASSERT_EQ(parse(mixed, d), IDEM_OK);
    EXPECT_EQ(d, digest_from_hex(abc_lower));
}

// Every digit value, in both cases and in both nibble positions.
TEST(HexParse, EveryDigitValue) {
    const std::string all = "0123456789abcdef0123456789abcdef0123456789ABCDEF0123456789ABCDEF";
    const std::uint8_t pattern[8] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    Digest d{};
    ASSERT_EQ(parse(all, d), IDEM_OK);
    for (std::size_t i = 0; i < d.size(); ++i)
        EXPECT_EQ(d[i], pattern[i % 8]) << "byte " << i;
    ASSERT_EQ(parse("1032547698badcfe1032547698badcfe1032547698BADCFE1032547698BADCFE", d), IDEM_OK);
    for (std::size_t i = 0; i < d.size(); ++i)
        EXPECT_EQ(d[i], static_cast<std::uint8_t>((pattern[i % 8] << 4) | (pattern[i % 8] >> 4))) << "byte " << i;
}

TEST(HexParse, WrongLengths) {
    Digest d{};
    EXPECT_EQ(idem_core_parse_sha256_hex(nullptr, 0, d.data()), IDEM_ERR_HEX_LENGTH);
    EXPECT_EQ(parse("a", d), IDEM_ERR_HEX_LENGTH);
    EXPECT_EQ(parse(abc_lower.substr(0, 63), d), IDEM_ERR_HEX_LENGTH);
    EXPECT_EQ(parse(abc_lower + "0", d), IDEM_ERR_HEX_LENGTH);
    EXPECT_EQ(parse(abc_lower + abc_lower, d), IDEM_ERR_HEX_LENGTH);
    EXPECT_EQ(parse("0x" + abc_lower.substr(0, 62), d), IDEM_ERR_HEX_DIGIT);  // 64 chars, 'x' is not a digit
}

// Every byte value, at the first (high nibble) and last (low nibble) position.
TEST(HexParse, EveryNonHexByteIsRejected) {
    Digest d{};
    for (int byte = 0; byte < 256; ++byte) {
        const bool is_hex = hex_digits.find(static_cast<char>(byte)) != std::string::npos;
        for (std::size_t position : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{63}}) {
            std::string hex = abc_lower;
            hex[position] = static_cast<char>(byte);
            EXPECT_EQ(parse(hex, d), is_hex ? IDEM_OK : IDEM_ERR_HEX_DIGIT)
                << "byte 0x" << std::hex << byte << " at " << std::dec << position;
        }
    }
}

TEST(HexParse, FailureLeavesOutputUntouched) {
    Digest d;
    d.fill(0xaa);
    std::string bad = abc_lower;
    bad[63] = 'g';
    EXPECT_EQ(parse(bad, d), IDEM_ERR_HEX_DIGIT);
    EXPECT_EQ(parse(abc_lower.substr(1), d), IDEM_ERR_HEX_LENGTH);
    for (std::uint8_t byte : d)
        EXPECT_EQ(byte, 0xaa);
}

TEST(ToHex, LowercaseDigits) {
    Digest d{};
    for (std::size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<std::uint8_t>(i * 8 + 7);  // 07 0f 17 ... ff: every high nibble
    EXPECT_EQ(to_hex(d), "070f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff");
    d.fill(0xab);
    EXPECT_EQ(to_hex(d), "abababababababababababababababababababababababababababababababab");
}

// idem_hash allocates exactly 64 bytes for the text: no terminator may be written.
TEST(ToHex, WritesExactly64Characters) {
    char out[IDEM_SHA256_HEX_CHARS + 2];
    std::memset(out, '#', sizeof out);
    const Digest d = digest_from_hex(abc_lower);
    idem_core_sha256_to_hex(d.data(), out);
    EXPECT_EQ(std::string(out, IDEM_SHA256_HEX_CHARS), abc_lower);
    EXPECT_EQ(out[IDEM_SHA256_HEX_CHARS], '#');
    EXPECT_EQ(out[IDEM_SHA256_HEX_CHARS + 1], '#');
}

TEST(HexRoundTrip, ParseOfToHexGivesTheBytesBack) {
    for (int i = 0; i < 256; ++i) {
        Digest d{};
        d.fill(static_cast<std::uint8_t>(i));
        d[i % 32] = static_cast<std::uint8_t>(255 - i);
        Digest back{};
        ASSERT_EQ(parse(to_hex(d), back), IDEM_OK);
        EXPECT_EQ(back, d) << i;
    }
}

TEST(HexRoundTrip, ToHexOfParsedUppercaseIsLowercase) {
    Digest d{};
    ASSERT_EQ(parse(upper(abc_lower), d), IDEM_OK);
    EXPECT_EQ(to_hex(d), abc_lower);
}
