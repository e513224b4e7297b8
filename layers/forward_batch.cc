#include "kda/layers/forward_batch.h"

namespace kda {

const char* ForwardModeName(ForwardMode mode) {
  switch (mode) {
    case ForwardMode::kExtend:
      return "EXTEND";
    case ForwardMode::kDecode:
      return "DECODE";
    case ForwardMode::kIdle:
      return "IDLE";
    case ForwardMode::kMixed:
      return "MIXED";
    case ForwardMode::kDraftExtend:
      return "DRAFT_EXTEND";
    case ForwardMode::kTargetVerify:
      return "TARGET_VERIFY";
  }
  return "?";
}

}  // namespace kda
