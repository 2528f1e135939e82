/*
 * half.cpp — IEEE 754 binary16 ("half", the element of pgvector's halfvec)
 * to and from float32.
 *
 * Widening is exact, so a distance over half vectors is defined as the
 * float32 distance (distance.cpp) of the widened values: the CPU and the GPU
 * engine widen the same way and agree bit for bit.  Narrowing rounds to
 * nearest, ties to even (what pgvector's float4 -> halfvec cast does); a
 * value that came from a half narrows back to itself.
 *
 * The bulk conversions use F16C (vcvtph2ps / vcvtps2ph) where the CPU has
 * it, chosen once per process; the scalar code is the reference and gives
 * the same bits.
 */
#include <cstring>

#include "core_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gpuivf {

float half_to_float(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        /* infinity; a NaN keeps its payload and becomes quiet (as vcvtph2ps does) */
        bits = sign | 0x7f800000u | (man != 0 ? 0x400000u : 0u) | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign; /* signed zero */
    } else {
        /* subnormal: man * 2^-24, normalized for float32 */
        uint32_t shifts = 0;
        while ((man & 0x400u) == 0) {
            man <<= 1;
            shifts++;
        }
        bits = sign | ((113u - shifts) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t float_to_half(float f) noexcept {
    uint32_t x;
    std::memcpy(&x, &f, sizeof(x));
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* infinity; NaN stays a (quiet) NaN */
        return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds past the largest half (65504) */
        return static_cast<uint16_t>(sign | 0x7c00u);
    if (ax < 0x38800000u) {
        /* below 2^-14: a subnormal half (or zero), round(|f| * 2^24) */
        if (ax < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself ties to even 0) */
            return sign;
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (r & 1u))) r++;
        return static_cast<uint16_t>(sign | r);
    }
    /* normal: rebias 127 -> 15 and round the 13 dropped bits (a carry may
     * move into the exponent, or up to infinity: both are right) */
    uint32_t r = (ax - 0x38000000u) >> 13;
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return static_cast<uint16_t>(sign | r);
}

namespace {

void half_to_float_scalar(const uint16_t *in, float *out, int64_t n) noexcept {
    for (int64_t i = 0; i < n; i++) out[i] = half_to_float(in[i]);
}

void float_to_half_scalar(const float *in, uint16_t *out, int64_t n) noexcept {
    for (int64_t i = 0; i < n; i++) out[i] = float_to_half(in[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void half_to_float_f16c(const uint16_t *in, float *out,
                                                              int64_t n) noexcept {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i *>(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; i++) out[i] = half_to_float(in[i]);
}

__attribute__((target("avx,f16c"))) void float_to_half_f16c(const float *in, uint16_t *out,
                                                              int64_t n) noexcept {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), h);
    }
    for (; i < n; i++) out[i] = float_to_half(in[i]);
}

bool have_f16c() noexcept {
    static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
    return yes;
}
#endif

}  // namespace

void half_to_float_n(const uint16_t *in, float *out, int64_t n) noexcept {
#if defined(__x86_64__)
    if (have_f16c()) {
        half_to_float_f16c(in, out, n);
        return;
    }
#endif
    half_to_float_scalar(in, out, n);
}

void float_to_half_n(const float *in, uint16_t *out, int64_t n) noexcept {
#if defined(__x86_64__)
    if (have_f16c()) {
        float_to_half_f16c(in, out, n);
        return;
    }
#endif
    float_to_half_scalar(in, out, n);
}

}  // namespace gpuivf
