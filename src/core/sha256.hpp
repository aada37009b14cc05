// SHA-256 through OpenSSL's EVP interface.
#pragma once

#include <cstddef>
#include <memory>

#include "errors.hpp"
#include "hex.hpp"

struct evp_md_ctx_st;

namespace idem::core {

// One running digest. Owns its EVP context; movable, not copyable.
class Sha256 {
public:
    Sha256();  // throws OpenSslError when OpenSSL cannot start a digest
    void update(const void* data, std::size_t len);
    Sha256Digest finish();
    // Starts a new digest on the same context: no allocation.
    void reset();

    // A context owned by the calling thread, reset and ready: for short one-off digests.
    static Sha256& reusable();

private:
    struct FreeContext {
        void operator()(evp_md_ctx_st* ctx) const;
    };
    std::unique_ptr<evp_md_ctx_st, FreeContext> ctx_;
};

Sha256Digest sha256(const void* data, std::size_t len);

}  // namespace idem::core
