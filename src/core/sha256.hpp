// SHA-256 through OpenSSL's SHA256_* functions: the digest without the EVP provider dispatch, which costs more
// than the compression of a short key (EVP_DigestInit_ex alone is about 1,100 instructions a digest).
#pragma once

#include <cstddef>

#include <openssl/sha.h>

#include "errors.hpp"
#include "hex.hpp"

namespace idem::core {

// One running digest. Holds its state by value: no allocation, copyable.
class Sha256 {
public:
    Sha256();  // throws OpenSslError when OpenSSL cannot start a digest
    void update(const void* data, std::size_t len);
    Sha256Digest finish();
    // Starts a new digest.
    void reset();

    // A context owned by the calling thread, reset and ready: for short one-off digests.
    static Sha256& reusable();

private:
    SHA256_CTX ctx_;
};

Sha256Digest sha256(const void* data, std::size_t len);

}  // namespace idem::core
