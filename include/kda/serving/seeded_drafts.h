// A draft source for benchmarks and tests of speculative decoding, where the
// layers have no language-model head: a request's true rows are its input
// rows, and acceptance follows a seeded rule (serving/seeded_drafts.cc).
#pragma once

#include <cstdint>

#include "kda/base/dtype.h"
#include "kda/serving/scheduler.h"

namespace kda {

// The number of drafts accepted out of k at the step after `committed` rows:
// each draft is accepted with probability alpha, stopping at the first
// rejection. A function of (seed, committed, k) only, so every rank of a
// tensor-parallel group and every rerun draws the same.
int64_t SeededAcceptedDrafts(uint64_t seed, int64_t committed, int64_t k, double alpha);

// Proposes min(k, max_k) drafts per step over `input` [length, hidden] (the
// request's rows, activation dtype): the first a = SeededAcceptedDrafts(...)
// are the request's true next rows, the rest a different row (the true row
// negated); accept returns a. `input` must outlive the source's use.
DraftSource SeededDraftSource(ConstBuf input, int64_t hidden, int64_t k, double alpha, uint64_t seed);

}  // namespace kda
