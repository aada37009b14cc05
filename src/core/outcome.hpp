// The decisions: what a claim answers, and what a completion does with a response.
#pragma once

#include <cstdint>

#include "idem_core.h"

namespace idem::core {

IdemClaimOutcome decide_claim(const IdemClaimFacts& facts);

IdemCompletion decide_completion(std::int32_t http_status, std::uint64_t response_bytes,
                                 std::uint64_t max_response_bytes);

bool is_valid_http_status(std::int32_t http_status);

}  // namespace idem::core
