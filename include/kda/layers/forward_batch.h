// One forward step's batch as the scheduler hands it to the model runner.
#pragma once

#include <cstdint>
#include <vector>

namespace kda {

// EXTEND: prefill and chunked-prefill continuation (packed varlen) -> chunk
// kernel. DECODE: one token per request -> recurrent kernel. IDLE: no tokens
// (a data-parallel rank with nothing to do) -> zeros, no state touched. The
// speculative-decoding modes and MIXED are refused for KDA.
enum class ForwardMode : uint8_t { kExtend, kDecode, kIdle, kMixed, kDraftExtend, kTargetVerify };

const char* ForwardModeName(ForwardMode mode);

struct ForwardBatch {
  ForwardMode mode = ForwardMode::kExtend;
  std::vector<int64_t> req_ids;      // [N] requests, each holding a state slot
  std::vector<int64_t> extend_lens;  // [N] tokens of each request in this step (1 in DECODE)
  std::vector<int64_t> prefix_lens;  // [N] tokens of each request processed before this step
  // [N] or empty: the request's slot was seeded with an initial state before
  // its first step, so it continues from it even at prefix 0.
  std::vector<uint8_t> state_seeded;

  int64_t num_tokens() const {
    int64_t t = 0;
    for (int64_t l : extend_lens) t += l;
    return t;
  }
};

}  // namespace kda
