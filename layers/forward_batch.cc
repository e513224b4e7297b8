#include "kda/layers/forward_batch.h"

#include <iterator>

namespace kda {

const char* ForwardModeName(ForwardMode mode) {
  // In the enum's order.
  static constexpr const char* kNames[] = {"EXTEND", "DECODE", "IDLE", "MIXED", "DRAFT_EXTEND", "TARGET_VERIFY"};
  const auto i = static_cast<size_t>(mode);
  return i < std::size(kNames) ? kNames[i] : "?";
}

BatchRows RowsOf(const ForwardBatch& batch, int64_t req_id) {
  BatchRows r;
  int64_t at = 0;
  for (size_t i = 0; i < batch.req_ids.size(); ++i) {
    if (batch.req_ids[i] == req_id) r = {at, batch.extend_lens[i]};
    at += batch.extend_lens[i];
  }
  return r;
}

}  // namespace kda
