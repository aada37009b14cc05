// How the core's C facade turns exceptions into statuses (errors.hpp): only an OpenSSL failure is
// IDEM_ERR_CRYPTO; every other exception, a std::runtime_error included, is IDEM_ERR_INTERNAL.
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>
#include <type_traits>

#include "errors.hpp"
#include "idem_core.h"

using idem::core::guarded;
using idem::core::OpenSslError;

TEST(Guarded, PassesTheBodysStatusThrough) {
    EXPECT_EQ(guarded([] { return IDEM_OK; }), IDEM_OK);
    EXPECT_EQ(guarded([] { return IDEM_ERR_HEX_DIGIT; }), IDEM_ERR_HEX_DIGIT);
}

TEST(Guarded, OpenSslErrorIsCrypto) {
    EXPECT_EQ(guarded([]() -> IdemStatus { throw OpenSslError("EVP_DigestUpdate failed"); }), IDEM_ERR_CRYPTO);
}

TEST(Guarded, OtherRuntimeErrorIsInternalNotCrypto) {
    EXPECT_EQ(guarded([]() -> IdemStatus { throw std::runtime_error("not OpenSSL"); }), IDEM_ERR_INTERNAL);
    EXPECT_EQ(guarded([]() -> IdemStatus { throw std::out_of_range("a bug"); }), IDEM_ERR_INTERNAL);
}

TEST(Guarded, BadAllocAndNonStandardThrowsAreInternal) {
    EXPECT_EQ(guarded([]() -> IdemStatus { throw std::bad_alloc(); }), IDEM_ERR_INTERNAL);
    EXPECT_EQ(guarded([]() -> IdemStatus { throw 42; }), IDEM_ERR_INTERNAL);
}

// The facade's functions are noexcept, so an exception can never unwind into the PostgreSQL layer's C frames.
TEST(Facade, EveryEntryPointIsNoexcept) {
    static_assert(noexcept(idem_core_status_message(IDEM_OK)));
    static_assert(noexcept(idem_core_validate_key(nullptr, 0)));
    static_assert(noexcept(idem_core_validate_scope(nullptr, 0)));
    static_assert(noexcept(idem_core_check_controls(nullptr, 0)));
    static_assert(noexcept(idem_core_check_header_name(nullptr, 0)));
    static_assert(noexcept(idem_core_check_header_value(nullptr, 0)));
    static_assert(noexcept(idem_core_fixed_span_usecs(0, 0, 0)));
    static_assert(noexcept(idem_core_parse_sha256_hex(nullptr, 0, nullptr)));
    static_assert(noexcept(idem_core_sha256_to_hex(nullptr, nullptr)));
    static_assert(noexcept(idem_core_sha256(nullptr, 0, nullptr)));
    static_assert(noexcept(idem_core_key_identity(nullptr, 0, nullptr, 0, nullptr)));
    static_assert(noexcept(idem_core_lock_tag(nullptr)));
    static_assert(noexcept(idem_core_decide_claim(nullptr)));
    static_assert(noexcept(idem_core_decide_completion(0, 0, 0)));
    static_assert(noexcept(idem_core_outcome_name(IDEM_OUTCOME_CLAIMED)));
    SUCCEED();
}
