// OpenSSL 3 marks SHA256_Init/Update/Final deprecated in favour of EVP; they remain part of its API and run the
// same assembly, without the provider lookup and context indirection that EVP adds to every call.
#define OPENSSL_SUPPRESS_DEPRECATED

#include "sha256.hpp"

#include "errors.hpp"

namespace idem::core {

namespace {

void check(int ok, const char* what) {
    if (ok != 1)
        throw OpenSslError(what);
}

}  // namespace

Sha256::Sha256() : ctx_() { reset(); }

void Sha256::reset() { check(SHA256_Init(&ctx_), "SHA256_Init failed"); }

Sha256& Sha256::reusable() {
    thread_local Sha256 context;
    context.reset();
    return context;
}

void Sha256::update(const void* data, std::size_t len) {
    if (len > 0)
        check(SHA256_Update(&ctx_, data, len), "SHA256_Update failed");
}

Sha256Digest Sha256::finish() {
    Sha256Digest digest{};
    check(SHA256_Final(digest.data(), &ctx_), "SHA256_Final failed");
    return digest;
}

Sha256Digest sha256(const void* data, std::size_t len) {
    Sha256& digest = Sha256::reusable();
    digest.update(data, len);
    return digest.finish();
}

}  // namespace idem::core
