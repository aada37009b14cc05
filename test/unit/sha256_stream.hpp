// Incremental SHA-256 as a C-style stream, for the unit tests and the fuzz target only:
// the extension hashes whole buffers (idem_core_sha256, idem_core_key_identity) and
// exports no stream. A thin layer over the core's Sha256 class; exceptions become
// statuses through the core's own guarded() (errors.hpp), as in its C facade.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "errors.hpp"
#include "idem_core.h"
#include "sha256.hpp"

struct Sha256Stream {
    idem::core::Sha256 digest;
};

// nullptr when the digest cannot be started.
inline Sha256Stream* sha256_stream_begin() {
    try {
        return new Sha256Stream();
    } catch (...) {
        return nullptr;
    }
}

inline IdemStatus sha256_stream_update(Sha256Stream* stream, const void* data, std::size_t len) {
    return idem::core::guarded([&] {
        stream->digest.update(data, len);
        return IDEM_OK;
    });
}

// Writes the digest and frees the stream, whatever the result.
inline IdemStatus sha256_stream_finish(Sha256Stream* stream, std::uint8_t out[IDEM_SHA256_BYTES]) {
    const IdemStatus status = idem::core::guarded([&] {
        const idem::core::Sha256Digest digest = stream->digest.finish();
        std::memcpy(out, digest.data(), digest.size());
        return IDEM_OK;
    });
    delete stream;
    return status;
}

inline void sha256_stream_abandon(Sha256Stream* stream) { delete stream; }
