#include "sha256.hpp"

#include <openssl/evp.h>

#include "errors.hpp"

namespace idem::core {

namespace {

// Fetched once: an implicit fetch on every init costs more than hashing a short key.
const EVP_MD* sha256_method() {
    static const EVP_MD* method = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (method == nullptr)
        throw OpenSslError("OpenSSL has no SHA256 implementation");
    return method;
}

void check(int ok, const char* what) {
    if (ok != 1)
        throw OpenSslError(what);
}

}  // namespace

void Sha256::FreeContext::operator()(evp_md_ctx_st* ctx) const { EVP_MD_CTX_free(ctx); }

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_)
        throw OpenSslError("EVP_MD_CTX_new failed");
    reset();
}

void Sha256::reset() {
    check(EVP_DigestInit_ex(ctx_.get(), sha256_method(), nullptr), "EVP_DigestInit_ex failed");
}

Sha256& Sha256::reusable() {
    thread_local Sha256 context;
    context.reset();
    return context;
}

void Sha256::update(const void* data, std::size_t len) {
    if (len > 0)
        check(EVP_DigestUpdate(ctx_.get(), data, len), "EVP_DigestUpdate failed");
}

Sha256Digest Sha256::finish() {
    Sha256Digest digest{};
    unsigned int written = 0;
    check(EVP_DigestFinal_ex(ctx_.get(), digest.data(), &written), "EVP_DigestFinal_ex failed");
    if (written != digest.size())
        throw OpenSslError("SHA-256 digest has an unexpected length");
    return digest;
}

Sha256Digest sha256(const void* data, std::size_t len) {
    Sha256& digest = Sha256::reusable();
    digest.update(data, len);
    return digest.finish();
}

}  // namespace idem::core
