// Fuzzes the safetensors reader: header parsing, dtype/shape/data_offsets validation, tiling of the data
// section, and the copy-out helpers on whatever it accepts.
//
// Input: one mode byte, then the body (run-length macros expanded, see fuzz_util.h). Odd mode: the body is
// "header JSON \0 data section" and is framed with its length prefix here; even mode: the body is the whole file.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_util.h"
#include "kda/base/error.h"
#include "kda/io/safetensors.h"

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return kda::fuzz::MutateWithMacros(data, size, max_size, seed);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body = kda::fuzz::Expand(data + 1, size - 1);
  std::string file;
  if ((data[0] & 1) != 0) {
    const size_t nul = body.find('\0');
    file = nul == std::string::npos ? kda::fuzz::FrameSafetensors(body, "")
                                    : kda::fuzz::FrameSafetensors(body.substr(0, nul), body.substr(nul + 1));
  } else {
    file = body;
  }
  const kda::fuzz::MemFile mem(file);
  try {
    const kda::SafetensorsFile st = kda::SafetensorsFile::Open(mem.path());
    uint64_t total = 0;
    for (const kda::TensorInfo& t : st.tensors()) {
      // What the reader accepted is consistent: the byte count matches the shape, the data lies in the file.
      const int64_t numel = t.numel();
      if (numel < 0 || static_cast<uint64_t>(numel) * kda::DTypeSize(t.dtype) != t.nbytes) std::abort();
      if (!st.Has(t.name) || &st.Get(t.name) != &t) std::abort();
      total += t.nbytes;
      if (t.dtype == kda::DType::kF32 || t.dtype == kda::DType::kBF16) {
        const std::vector<float> v = kda::ToFloatVector(t);
        if (v.size() != static_cast<size_t>(numel)) std::abort();
        try {
          kda::CheckAllFinite(v.data(), numel, t.shape, t.name);
        } catch (const kda::Error&) {
        }
      } else if (kda::ToInt64Vector(t).size() != static_cast<size_t>(numel)) {
        std::abort();
      }
    }
    if (total > file.size()) std::abort();
  } catch (const kda::Error&) {
    // Refused with a message: the expected outcome for bad input.
  }
  return 0;
}
