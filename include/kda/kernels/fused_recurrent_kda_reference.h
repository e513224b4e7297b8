// The plain reference of fused_recurrent_kda: the token-by-token recurrence of
// design §2.5 (kernels/kda/fused_recurrent_kda_reference.cc). Arguments:
// kda_args.h.
#pragma once

#include "kda/kernels/kda_args.h"

namespace kda {

void fused_recurrent_kda_reference(const RecurrentKdaArgs& a);

}  // namespace kda
