// The instruction-set target of a per-ISA kernel source. CMake compiles every
// per-ISA source (the kernels' *_simd.cc, KDA_ISA_SOURCES in CMakeLists.txt) once per target, each
// copy with its -m flags and KDA_TARGET naming the target; everything such a
// source defines lives in the target's namespace, kda::KDA_TARGET_NS
// (kda::N_GENERIC, kda::N_AVX2, kda::N_AVX512, kda::N_AVX512_SHAPE), so that inline helpers shared
// by the copies are distinct functions and the linker can never hand an
// AVX-512 copy to a CPU without AVX-512.
//
// Per-ISA sources call no inline code from outside their namespace (no std::
// templates, no kda:: inline helpers of other headers) except the
// always-inline kda::BF16RoundedBits / BF16RoundedFiniteBits, the fp16
// conversions of kda/base/f16.h and the state routing of
// kernels/kda/kda_states.h; host code
// (validation, allocation, threads) stays in the baseline sources and reaches the kernels through the
// dispatch table (kernels/isa/dispatch.h).
#pragma once

#define KDA_TARGET_GENERIC 0
#define KDA_TARGET_AVX2 1
#define KDA_TARGET_AVX512 2
// A test variant: the AVX-512 target's shapes (16 lanes, 32 registers, its
// register blocks and streaming stores) in portable vectors on AVX2 + FMA, so
// that CPUs without AVX-512 run and test the code paths that the lane count
// and register count select (see Vec in kernels/isa/vec.h).
#define KDA_TARGET_AVX512_SHAPE 3
// Whether the target has the AVX-512 target's shapes (lanes, registers, blocks).
#define KDA_TARGET_AVX512_SHAPED (KDA_TARGET == KDA_TARGET_AVX512 || KDA_TARGET == KDA_TARGET_AVX512_SHAPE)

#ifndef KDA_TARGET
#error "per-ISA kernel sources are compiled with -DKDA_TARGET=KDA_TARGET_<isa> (see CMakeLists.txt)"
#endif

#if KDA_TARGET == KDA_TARGET_AVX512
#if !defined(__AVX512F__) || !defined(__AVX2__) || !defined(__FMA__)
#error "the AVX-512 target needs -mavx512f -mavx2 -mfma"
#endif
#define KDA_TARGET_NS N_AVX512
#elif KDA_TARGET == KDA_TARGET_AVX2
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the AVX2 target needs -mavx2 -mfma -mf16c"
#endif
#define KDA_TARGET_NS N_AVX2
#elif KDA_TARGET == KDA_TARGET_AVX512_SHAPE
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the avx512_shape target needs -mavx2 -mfma -mf16c"
#endif
#define KDA_TARGET_NS N_AVX512_SHAPE
#elif KDA_TARGET == KDA_TARGET_GENERIC
#define KDA_TARGET_NS N_GENERIC
#else
#error "unknown KDA_TARGET"
#endif
