// Key identity (SHA-256 of length-prefixed scope and key) and the advisory lock tag taken from it.
#include <gtest/gtest.h>

#include <string>

#include "test_support.hpp"

namespace {

Digest identity(const std::string& scope, const std::string& key) {
    Digest d{};
    if (idem_core_key_identity(scope.data(), scope.size(), key.data(), key.size(), d.data()) != IDEM_OK)
        throw std::runtime_error("idem_core_key_identity failed");
    return d;
}

constexpr bool little_endian = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;

}  // namespace

TEST(KeyIdentity, ScopeKeyBoundaryMatters) {
    EXPECT_NE(identity("a", "bc"), identity("ab", "c"));
    EXPECT_NE(identity("", "abc"), identity("abc", ""));
    EXPECT_NE(identity(std::string("a\0", 2), "b"), identity("a", std::string("\0b", 2)));
}

TEST(KeyIdentity, IsStable) {
    const Digest first = identity("tenant-1", "order-42");
    identity("other", "key");
    EXPECT_EQ(identity("tenant-1", "order-42"), first);
}

TEST(KeyIdentity, DiffersByScope) {
    EXPECT_NE(identity("s1", "k"), identity("s2", "k"));
    EXPECT_NE(identity("", "k"), identity("s1", "k"));
}

TEST(KeyIdentity, IsNotThePlainHashOfTheKey) {
    EXPECT_NE(identity("", "k"), sha256_one_shot("k"));
}

// Pinned values (computed with Python hashlib over u32 little-endian lengths): a backend that
// still runs an older library build must derive the same lock for the same key.
TEST(KeyIdentity, PinnedFormat) {
    if (!little_endian)
        GTEST_SKIP() << "pinned values assume little-endian length prefixes";
    EXPECT_EQ(hex_of(identity("", "k")), "90ba9bc00c5442c85c7a093f0c3e084ce2b7e8963319dc3d8cc7e93f411cac1a");
    EXPECT_EQ(hex_of(identity("tenant-1", "order-42")),
              "e719ab5ee51e11fb264aa97427f586b8069711dfc4ffd48c40ff19647e4e6866");
    EXPECT_EQ(hex_of(identity("a", "bc")), "47ea6f805c5b663e33012cd34184e1398ad81a0dcea50071346f05d26692e843");
    EXPECT_EQ(hex_of(identity("ab", "c")), "60014a36d7b05b0730e42a8b96faa1ffb4bd28469aea4000191179f01561ddb7");
}

// The tag is the first 8 identity bytes, big-endian; the PG layer splits it into two 32-bit lock fields.
TEST(LockTag, FirstEightBytesBigEndian) {
    Digest d{};
    for (std::size_t i = 0; i < d.size(); ++i)
        d[i] = static_cast<std::uint8_t>(i + 1);
    EXPECT_EQ(idem_core_lock_tag(d.data()), UINT64_C(0x0102030405060708));
}

TEST(LockTag, ExtremeValues) {
    Digest d{};
    EXPECT_EQ(idem_core_lock_tag(d.data()), UINT64_C(0));
    d.fill(0xff);
    EXPECT_EQ(idem_core_lock_tag(d.data()), UINT64_MAX);
}

TEST(LockTag, OnlyTheFirstEightBytesCount) {
    Digest d{};
    d.fill(0x5a);
    const std::uint64_t base = idem_core_lock_tag(d.data());
    for (std::size_t i = 0; i < d.size(); ++i) {
        Digest changed = d;
        changed[i] ^= 0x01;
        if (i < 8)
            EXPECT_NE(idem_core_lock_tag(changed.data()), base) << "byte " << i;
        else
            EXPECT_EQ(idem_core_lock_tag(changed.data()), base) << "byte " << i;
    }
}

TEST(LockTag, OfAKnownKey) {
    if (!little_endian)
        GTEST_SKIP() << "pinned values assume little-endian length prefixes";
    EXPECT_EQ(idem_core_lock_tag(identity("tenant-1", "order-42").data()), UINT64_C(0xe719ab5ee51e11fb));
    EXPECT_NE(idem_core_lock_tag(identity("a", "bc").data()), idem_core_lock_tag(identity("ab", "c").data()));
}
