// The serving tests' comparisons of a request's results (fp32 activations).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kda/serving/scheduler.h"
#include "tests/tolerance.h"

namespace kda::testing {

// Bytes of fp32 values as floats (none: empty, with null data).
inline std::vector<float> AsFloats(const std::vector<uint8_t>& bytes) {
  std::vector<float> r(bytes.size() / sizeof(float));
  if (!r.empty()) std::memcpy(r.data(), bytes.data(), r.size() * sizeof(float));
  return r;
}

// got's final states against want's: the recurrent state within the state rule
// (design §5), the conv state within the fp32 rule or, with conv_state_rule,
// within the state rule too.
inline ::testing::AssertionResult SameFinalStates(const RequestResult& got, const RequestResult& want,
                                                  bool conv_state_rule) {
  auto r = AllCloseStateF32(got.final_recurrent.data(), want.final_recurrent.data(), want.final_recurrent.size());
  if (!r) return r << " (final recurrent state)";
  const std::vector<float> gc = AsFloats(got.final_conv);
  const std::vector<float> wc = AsFloats(want.final_conv);
  if (gc.size() != wc.size()) return ::testing::AssertionFailure() << "final conv state sizes differ";
  r = conv_state_rule ? AllCloseStateF32(gc.data(), wc.data(), gc.size())
                      : AllCloseF32(gc.data(), wc.data(), gc.size());
  if (!r) return r << " (final conv state)";
  return ::testing::AssertionSuccess();
}

}  // namespace kda::testing
