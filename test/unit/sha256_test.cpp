// SHA-256 against the NIST FIPS 180 example vectors, one-shot and streamed.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "sha256_stream.hpp"
#include "test_support.hpp"

namespace {

struct Vector {
    const char* name;
    std::string message;
    const char* expected;
};

const std::vector<Vector>& nist_vectors() {
    static const std::vector<Vector> vectors = {
        {"empty", "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"448 bits", "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"896 bits",
         "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
        {"one million a", std::string(1000000, 'a'),
         "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    return vectors;
}

// Feeds message in the given piece sizes, cycling; odd sizes straddle the 64-byte blocks.
Digest sha256_streamed(const std::string& message, const std::vector<std::size_t>& pieces) {
    Sha256Stream* stream = sha256_stream_begin();
    if (stream == nullptr)
        throw std::runtime_error("sha256_stream_begin failed");
    std::size_t offset = 0;
    for (std::size_t i = 0; offset < message.size(); ++i) {
        const std::size_t n = std::min(pieces[i % pieces.size()], message.size() - offset);
        if (sha256_stream_update(stream, message.data() + offset, n) != IDEM_OK) {
            sha256_stream_abandon(stream);
            throw std::runtime_error("sha256_stream_update failed");
        }
        offset += n;
    }
    Digest d{};
    if (sha256_stream_finish(stream, d.data()) != IDEM_OK)
        throw std::runtime_error("sha256_stream_finish failed");
    return d;
}

}  // namespace

TEST(Sha256, OneShotMatchesNistVectors) {
    for (const Vector& v : nist_vectors())
        EXPECT_EQ(hex_of(sha256_one_shot(v.message)), v.expected) << v.name;
}

TEST(Sha256, StreamedInOddPiecesMatchesNistVectors) {
    const std::vector<std::size_t> odd = {1, 3, 5, 7, 11, 13, 63, 65, 127};
    for (const Vector& v : nist_vectors())
        EXPECT_EQ(hex_of(sha256_streamed(v.message, odd)), v.expected) << v.name;
}

TEST(Sha256, StreamedInLargeOddPiecesMatchesMillionA) {
    const Vector& million = nist_vectors().back();
    EXPECT_EQ(hex_of(sha256_streamed(million.message, {997})), million.expected);
    EXPECT_EQ(hex_of(sha256_streamed(million.message, {65537, 1})), million.expected);
}

TEST(Sha256, StreamWithNoUpdateIsTheEmptyDigest) {
    Sha256Stream* stream = sha256_stream_begin();
    ASSERT_NE(stream, nullptr);
    ASSERT_EQ(sha256_stream_update(stream, nullptr, 0), IDEM_OK);
    Digest d{};
    ASSERT_EQ(sha256_stream_finish(stream, d.data()), IDEM_OK);
    EXPECT_EQ(hex_of(d), nist_vectors()[0].expected);
}

TEST(Sha256, OneShotOfNullEmptyBufferIsTheEmptyDigest) {
    Digest d{};
    ASSERT_EQ(idem_core_sha256(nullptr, 0, d.data()), IDEM_OK);
    EXPECT_EQ(hex_of(d), nist_vectors()[0].expected);
}

// The one-shot path reuses a per-thread context: each call must start from a fresh state.
TEST(Sha256, RepeatedOneShotCallsDoNotCarryState) {
    for (int round = 0; round < 3; ++round) {
        EXPECT_EQ(hex_of(sha256_one_shot("abc")), nist_vectors()[1].expected);
        EXPECT_EQ(hex_of(sha256_one_shot("")), nist_vectors()[0].expected);
    }
}

// Streams must not share the one-shot context, nor each other's.
TEST(Sha256, InterleavedStreamsAndOneShotsStayApart) {
    Sha256Stream* first = sha256_stream_begin();
    Sha256Stream* second = sha256_stream_begin();
    ASSERT_NE(first, nullptr);
    ASSERT_NE(second, nullptr);
    ASSERT_EQ(sha256_stream_update(first, "ab", 2), IDEM_OK);
    ASSERT_EQ(sha256_stream_update(second, "abcdbcde", 8), IDEM_OK);
    EXPECT_EQ(hex_of(sha256_one_shot("")), nist_vectors()[0].expected);
    ASSERT_EQ(sha256_stream_update(first, "c", 1), IDEM_OK);
    const std::string rest = nist_vectors()[2].message.substr(8);
    ASSERT_EQ(sha256_stream_update(second, rest.data(), rest.size()), IDEM_OK);
    Digest a{}, b{};
    ASSERT_EQ(sha256_stream_finish(first, a.data()), IDEM_OK);
    ASSERT_EQ(sha256_stream_finish(second, b.data()), IDEM_OK);
    EXPECT_EQ(hex_of(a), nist_vectors()[1].expected);
    EXPECT_EQ(hex_of(b), nist_vectors()[2].expected);
}

// Fails only in the sanitizer build (LeakSanitizer) if abandon does not free the stream.
TEST(Sha256, AbandonedStreamIsFreed) {
    Sha256Stream* stream = sha256_stream_begin();
    ASSERT_NE(stream, nullptr);
    ASSERT_EQ(sha256_stream_update(stream, "abc", 3), IDEM_OK);
    sha256_stream_abandon(stream);
}

// Backends are single-threaded, but the core promises per-thread contexts; a shared one corrupts digests.
TEST(Sha256, ConcurrentOneShotCallsAreIndependent) {
    const std::string messages[2] = {std::string(300, 'x'), std::string(301, 'y')};
    const std::string expected[2] = {hex_of(sha256_one_shot(messages[0])), hex_of(sha256_one_shot(messages[1]))};
    int wrong[2] = {0, 0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 20000; ++i) {
                try {
                    if (hex_of(sha256_one_shot(messages[t])) != expected[t])
                        ++wrong[t];
                } catch (const std::exception&) {
                    ++wrong[t];
                }
            }
        });
    for (std::thread& thread : threads)
        thread.join();
    EXPECT_EQ(wrong[0], 0);
    EXPECT_EQ(wrong[1], 0);
}
