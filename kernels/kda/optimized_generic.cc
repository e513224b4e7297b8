// The optimized KDA kernels in portable C++ (GCC/Clang vector extensions): the
// same source as the AVX2 and AVX-512 builds over a 4-lane vector type that
// the compiler lowers for the baseline target (SSE2 on x86-64). Used on CPUs
// without AVX2 + FMA and elsewhere; multiply-add is two roundings here (no FMA
// instruction assumed).
#include <cstdint>

#include "kda/base/bf16.h"
#include "kernels/kda/optimized.h"

namespace kda::internal {
namespace {

struct VecGeneric {
  static constexpr int kLanes = 4;
  // GCC/Clang vector extensions: portable, lowered to the target's SIMD (an
  // SSE2 register on baseline x86-64).
  using Reg = float __attribute__((vector_size(16)));
  using Mask = int32_t __attribute__((vector_size(16)));  // -1 where true

  static Reg Load(const float* p) {
    Reg r;
    __builtin_memcpy(&r, p, sizeof(r));
    return r;
  }
  static void Store(float* p, Reg x) { __builtin_memcpy(p, &x, sizeof(x)); }
  static Reg Set1(float x) { return Reg{} + x; }
  static Reg Zero() { return Reg{}; }
  static Reg Fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg Mul(Reg a, Reg b) { return a * b; }
  static Reg Sub(Reg a, Reg b) { return a - b; }
  static Reg Div(Reg a, Reg b) { return a / b; }
  static Mask Less(Reg a, Reg b) { return a < b; }
  static Reg Select(Mask m, Reg if_true, Reg if_false) {
    return reinterpret_cast<Reg>((reinterpret_cast<Mask>(if_true) & m) | (reinterpret_cast<Mask>(if_false) & ~m));
  }
  static bool Any(Mask m) {
    bool any = false;
    for (int i = 0; i < kLanes; ++i) any = any || m[i] != 0;
    return any;
  }
  static float ReduceAdd(Reg x) {
    float s = 0.0F;
    for (int i = 0; i < kLanes; ++i) s += x[i];
    return s;
  }

  // e^x, the algorithm of the AVX2 file: n = round(x log2(e)) (adding and
  // subtracting 1.5 * 2^23 rounds to nearest), Cody-Waite reduction, Cephes
  // polynomial, 2^n from exponent bits, 0 below 2^-126.
  static Reg Exp(Reg x) {
    const Mask tiny = x < -87.33654F;
    x = x > 88.0F ? Set1(88.0F) : x;
    x = x < -87.33654F ? Set1(-87.33654F) : x;
    constexpr float kRound = 12582912.0F;
    const Reg n = (x * 1.44269504088896341F + kRound) - kRound;
    Reg r = x - n * 0.693359375F;
    r = r - n * -2.12194440e-4F;
    Reg y = Set1(1.9875691500e-4F);
    y = y * r + 1.3981999507e-3F;
    y = y * r + 8.3334519073e-3F;
    y = y * r + 4.1665795894e-2F;
    y = y * r + 1.6666665459e-1F;
    y = y * r + 5.0000001201e-1F;
    y = y * (r * r) + r;
    y = y + 1.0F;
    const Mask bits = (__builtin_convertvector(n, Mask) + 127) << 23;
    return Select(tiny, Zero(), y * reinterpret_cast<Reg>(bits));
  }

  static Reg LoadBF16(const BF16* p) {
    Mask u;
    for (int i = 0; i < kLanes; ++i) u[i] = static_cast<int32_t>(static_cast<uint32_t>(p[i].bits) << 16);
    return reinterpret_cast<Reg>(u);
  }
  // Round to nearest even (as kda::ToBF16), NaN kept a quiet NaN.
  static void StoreBF16(BF16* p, Reg x) {
    for (int i = 0; i < kLanes; ++i) {
      uint32_t u = 0;
      const float f = x[i];
      __builtin_memcpy(&u, &f, sizeof(u));
      if ((u & 0x7fffffffU) > 0x7f800000U) {
        p[i].bits = static_cast<uint16_t>((u >> 16) | 0x40U);
      } else {
        p[i].bits = static_cast<uint16_t>((u + 0x7fffU + ((u >> 16) & 1U)) >> 16);
      }
    }
  }
};

}  // namespace
}  // namespace kda::internal

#include "kernels/kda/optimized_impl.h"

namespace kda::internal {

IsaKernels GenericKernels() {
  IsaKernels k;
  k.chunk_task = &RunChunkTask<VecGeneric, 4>;
  k.recurrent_task = &RunRecurrentTask<VecGeneric, 4>;
  k.column_block = 4 * VecGeneric::kLanes;
  return k;
}

}  // namespace kda::internal
