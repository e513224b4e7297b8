// Short causal depthwise convolution + SiLU over a packed variable-length
// batch, with per-sequence tails (the last W-1 inputs) in a slot-indexed
// buffer: the q/k/v short convs of KDA (design §2.2).
//
// For sequence n with tokens [cu[n], cu[n+1]) and channel c:
//   y[t, c] = silu( sum_{j=0..W-1} w[j, c] * X[t - (W-1) + j, c] + bias[c] )
// where rows before the sequence start come from its tail (oldest first), or
// are zero when has_initial_state[n] == 0. Tap W-1 multiplies the current token.
// The bias is optional (Mamba2's conv1d has one, KDA's q/k/v convs do not): it
// is added in fp32 to the fp32 tap sum, before the SiLU; without one, the sum
// goes to the SiLU as it is.
// The new tail is the last W-1 rows of [old tail; the sequence's inputs] (for a
// sequence shorter than W-1 tokens: the old tail shifted).
//
// Weight layout: tap-major [W, C] (w[j, c] at weight[j * C + c]), so each tap
// is one contiguous row over the channels, which the vectorised kernel reads
// directly. Checkpoints store conv1d weights as [C, 1, W]; they are laid out
// once at load time (ShortConvWeightFromCheckpoint), never per call.
#pragma once

#include <cstdint>
#include <vector>

#include "kda/base/dtype.h"

namespace kda {

struct ShortConvArgs {
  // Output.
  MutBuf y;  // [T, C] contiguous, F32 or BF16 (rounded once after the SiLU)
  // Inputs.
  ConstBuf x;                           // [T, x_row_stride], the C channels at the start of each row
  int64_t x_row_stride = 0;             // elements between rows of x (>= C)
  const float* weight = nullptr;        // [W, C], tap-major (see above)
  const float* bias = nullptr;          // [C] or null (no bias)
  const int64_t* cu_seqlens = nullptr;  // [N + 1]
  int64_t N = 0;
  int64_t T = 0;
  int64_t C = 0;
  int W = 0;
  // Tails, read and written in place: sequence n uses rows [W-1] of
  // tails[tail_indices[n]], each row tail_row_stride elements apart, C channels
  // at the start of each row. Same dtype as x.
  MutBuf tails;
  int64_t tail_row_stride = 0;
  int64_t num_tails = 0;
  // [N], distinct; < 0 marks a padding sequence (as chunk_kda's
  // state_indices): zero outputs, no tail read or written.
  const int32_t* tail_indices = nullptr;
  const uint8_t* has_initial_state = nullptr;  // [N] or null (all continue)
};

// Both validate (kda::Error, nothing written). The reference is the plain
// loop; short_conv_silu vectorises over channels, in jobs of (sequence,
// channel chunk), and at width 4 sums each token's taps in registers.
void short_conv_silu(const ShortConvArgs& a);
void short_conv_silu_reference(const ShortConvArgs& a);

// The kernels' weight layout [W, C] from a checkpoint's conv1d weight
// [C, W] (its [C, 1, W] without the unit dim). Throws kda::Error on a size
// other than C * W.
std::vector<float> ShortConvWeightFromCheckpoint(const std::vector<float>& weight_cw, int64_t C, int W);

}  // namespace kda
