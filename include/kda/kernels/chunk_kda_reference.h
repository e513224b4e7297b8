// The plain reference of chunk_kda: the chunked algorithm of design §3
// (kernels/kda/chunk_kda_reference.cc), independent of the token-by-token
// recurrence of fused_recurrent_kda_reference.h. Arguments: kda_args.h.
#pragma once

#include "kda/kernels/kda_args.h"

namespace kda {

void chunk_kda_reference(const ChunkKdaArgs& a);

}  // namespace kda
