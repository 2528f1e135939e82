/*
 * adc.cpp — asymmetric distance computation: the score of a PQ code is
 * bias + sum_j lut[j][code_j].  This loop is where a CPU query spends its
 * time, so it scores blocks of codes into a small buffer and only then
 * filters them against the running k-th best (most codes never touch the
 * heap).
 */
#include <algorithm>
#include <cstring>

#include "core_internal.h"

namespace gpuivf {

namespace {

/* load_u64 reads eight codes at once; the shifts below assume byte 0 is the
 * least significant (every x86-64). */
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ADC scan assumes a little-endian CPU");

/* Codes scored per block of the scan (the buffer stays in L1). */
constexpr int64_t kScanBlock = 256;

/* Eight code bytes at once: one load feeds eight table look-ups. */
inline uint64_t load_u64(const uint8_t *p) {
    uint64_t w;
    std::memcpy(&w, p, sizeof w);
    return w;
}

/* 8-bit codes: one byte per sub-quantizer.  Four interleaved sums give the
 * look-ups independent dependency chains. */
void scores_8bit(const float *lut, float bias, int m, const uint8_t *codes, int64_t n,
                 float *scores) {
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *code = codes + i * m;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int j = 0;
        for (; j + 8 <= m; j += 8) {
            const uint64_t w = load_u64(code + j);
            const float *t = lut + j * 256;
            s0 += t[0 * 256 + (w & 0xff)];
            s1 += t[1 * 256 + ((w >> 8) & 0xff)];
            s2 += t[2 * 256 + ((w >> 16) & 0xff)];
            s3 += t[3 * 256 + ((w >> 24) & 0xff)];
            s0 += t[4 * 256 + ((w >> 32) & 0xff)];
            s1 += t[5 * 256 + ((w >> 40) & 0xff)];
            s2 += t[6 * 256 + ((w >> 48) & 0xff)];
            s3 += t[7 * 256 + (w >> 56)];
        }
        for (; j < m; j++) s0 += lut[j * 256 + code[j]];
        scores[i] = bias + ((s0 + s1) + (s2 + s3));
    }
}

/* 4-bit codes: byte b holds sub-quantizers 2b (low nibble) and 2b + 1 (high). */
void scores_4bit(const float *lut, float bias, int m, const uint8_t *codes, int64_t n,
                 float *scores) {
    const int code_size = (m + 1) / 2;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *code = codes + i * code_size;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        int j = 0;
        for (; j + 16 <= m; j += 16) {
            const uint64_t w = load_u64(code + j / 2);
            const float *t = lut + j * 16;
            for (int b = 0; b < 16; b += 4) {
                s0 += t[(b + 0) * 16 + ((w >> (4 * b + 0)) & 0xf)];
                s1 += t[(b + 1) * 16 + ((w >> (4 * b + 4)) & 0xf)];
                s2 += t[(b + 2) * 16 + ((w >> (4 * b + 8)) & 0xf)];
                s3 += t[(b + 3) * 16 + ((w >> (4 * b + 12)) & 0xf)];
            }
        }
        for (; j < m; j++) {
            const uint8_t byte = code[j >> 1];
            s0 += lut[j * 16 + ((j & 1) ? (byte >> 4) : (byte & 0x0f))];
        }
        scores[i] = bias + ((s0 + s1) + (s2 + s3));
    }
}

}  // namespace

void ivfpq_adc_scores(const IvfPqModel &model, const float *lut, float bias, const uint8_t *codes,
                      int64_t n, float *scores) noexcept {
    if (model.nbits == 8)
        scores_8bit(lut, bias, model.m, codes, n, scores);
    else
        scores_4bit(lut, bias, model.m, codes, n, scores);
}

void ivfpq_adc_scan(const IvfPqModel &model, const float *lut, float bias, const uint8_t *codes,
                    const uint64_t *ids, int64_t n, TopK *topk) noexcept {
    const int code_size = pq_code_size(model.m, model.nbits);
    float scores[kScanBlock];
    float threshold = topk_threshold(topk);
    for (int64_t b0 = 0; b0 < n; b0 += kScanBlock) {
        const int64_t rows = std::min(kScanBlock, n - b0);
        ivfpq_adc_scores(model, lut, bias, codes + b0 * code_size, rows, scores);
        for (int64_t i = 0; i < rows; i++) {
            /* <=: a tie with the k-th may still win on the smaller id. */
            if (scores[i] <= threshold) {
                topk_push(topk, scores[i], ids[b0 + i]);
                threshold = topk_threshold(topk);
            }
        }
    }
}

}  // namespace gpuivf
