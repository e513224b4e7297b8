// The benchmarks' per-layer self-check (tools/layer_replay.cc): a traced
// request's layer inputs replayed through each layer alone, compared with what
// the served run computed.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"
#include "kda/base/tolerance.h"
#include "kda/kernels/kda_dispatch.h"
#include "kda/layers/forward_batch.h"
#include "kda/models/delta_rule_model.h"
#include "kda/serving/scheduler.h"

namespace kda::cli {

// Every layer's input and output rows of one request, appended step by step
// in token order (activation dtype): what the per-layer self-check replays.
class RequestTrace : public LayerObserver {
 public:
  RequestTrace(int64_t req_id, int num_layers)
      : req_id_(req_id), inputs_(static_cast<size_t>(num_layers)), outputs_(static_cast<size_t>(num_layers)) {}

  void OnBatch(const ForwardBatch& batch) override;
  void OnTensor(int layer_id, LayerTensor which, ConstBuf values, int64_t count) override;
  // Of the request's rows in the last batch (a TARGET_VERIFY step), only the
  // first `n` were kept: the rest are dropped from the trace.
  void KeepFirst(int64_t n);

  int64_t req_id() const { return req_id_; }
  const std::vector<std::vector<uint8_t>>& inputs() const { return inputs_; }    // per layer [tokens, hidden]
  const std::vector<std::vector<uint8_t>>& outputs() const { return outputs_; }  // per layer [tokens, hidden]

 private:
  int64_t req_id_;
  std::vector<std::vector<uint8_t>> inputs_;
  std::vector<std::vector<uint8_t>> outputs_;
  BatchRows at_;          // the request's rows in the current batch
  int64_t tokens_ = 0;    // the batch's tokens
  size_t row_bytes_ = 0;  // of one traced row
};

struct SelfCheck {
  ToleranceReport out;    // the layer with the largest output max_ratio
  ToleranceReport state;  // the layer with the largest state max_ratio
  bool pass = true;
};

// Each layer served vs replayed alone on the same input: the traced rows
// [0, decode_from) in one EXTEND step, each later row as a DECODE step
// (decode_from < 0: every row in one EXTEND step). `exact` (bf16 only): the
// same layers as the fp32 pipeline (fp32 activations, unrounded weights). The
// served run is the tested pipeline, the replay of the same pipeline the
// reference; the bf16 rule (design §5) also needs the exact output of that
// layer on that input, which the fp32 replay is: served may differ from the
// replay in bf16 rounding flips, not be less accurate.
SelfCheck ReplayCheck(const DeltaRuleModel& model, const DeltaRuleModel* exact, const RequestTrace& trace,
                      const RequestResult& served, KernelImpl kernel, int64_t decode_from = -1);

}  // namespace kda::cli
