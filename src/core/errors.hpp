// The core's one exception type of its own, and the one place exceptions become statuses.
#pragma once

#include <stdexcept>

#include "idem_core.h"

namespace idem::core {

// What an OpenSSL call that failed throws (sha256.cpp): only this is reported as IDEM_ERR_CRYPTO, so a
// std::runtime_error from anywhere else is never taken for an OpenSSL failure.
class OpenSslError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Runs body, which returns a status, and turns any exception into one: nothing escapes into C.
// OpenSslError: IDEM_ERR_CRYPTO; anything else (std::bad_alloc, a bug): IDEM_ERR_INTERNAL.
template <typename Body>
IdemStatus guarded(Body&& body) noexcept {
    try {
        return body();
    } catch (const OpenSslError&) {
        return IDEM_ERR_CRYPTO;
    } catch (...) {
        return IDEM_ERR_INTERNAL;
    }
}

}  // namespace idem::core
