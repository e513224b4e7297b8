// Test hooks of the KDA kernel dispatcher (not part of the public API).
#pragma once

namespace kda::internal {

// Forgets the SetDefaultKernelImpl value and the parsed KDA_KERNEL
// environment variable, so that the next DefaultKernelImpl() reads it again.
void ResetDefaultKernelImplForTesting();

// Forgets the SetKernelIsa value and the parsed KDA_ISA environment variable.
void ResetKernelIsaForTesting();

}  // namespace kda::internal
