/*
 * rescore.h — the last step of every search: take each row's selected
 * candidates (packed keys), optionally score them again exactly against full
 * vectors with the CPU's arithmetic, sort by (value, id) as the CPU does
 * (NaN after numbers, then smaller id) and write the k best.
 */
#ifndef GPUIVF_CUDA_RESCORE_H
#define GPUIVF_CUDA_RESCORE_H

#include "resources.h"

namespace gpuivf_cuda {

enum class RescoreMode : int32_t {
    Keys = 0,        /* value = the key's score */
    KnnExact = 1,    /* exact internal score of prepared query vs base row index */
    SqlDistance = 2  /* gpuivf::metric_distance of raw query vs stored raw vector */
};

struct RescoreArgs {
    RescoreMode mode = RescoreMode::Keys;
    Metric metric = Metric::L2;
    const Key *keys = nullptr; /* rows x key_ld, `candidates` used per row */
    int64_t key_ld = 0;
    int32_t candidates = 0;    /* <= 1024 */
    /* runs > 1: a row is `runs` sorted runs of `candidates` keys (the probe
     * splits of a scan, sentinels after each run's valid keys), and its
     * candidates are the run_k[row] (or `candidates`) best keys of all runs,
     * chosen by the kernel (rescore_takes_runs says when it can) */
    int32_t runs = 1;
    const int32_t *run_k = nullptr;
    /* a key at or above each run's k-th (rows x runs; the runs may then be
     * in any order), or null: the runs are ascending */
    const Key *run_bounds = nullptr;
    int64_t rows = 0;
    const int32_t *row_k = nullptr; /* outputs per row (or k) */
    int32_t k = 0;
    const uint64_t *ids = nullptr;  /* key index -> id (null: the index itself) */
    const float *queries = nullptr; /* rows x d (prepared for KnnExact, raw for SqlDistance) */
    int32_t d = 0;
    const float *vectors = nullptr; /* indexed by key index, d floats each */
    /* SqlDistance of a half-precision index: its vectors instead, d IEEE
     * halves (uint16 words) each, widened exactly */
    const uint16_t *vectors_half = nullptr;
    const float *vector_scale = nullptr; /* KnnExact cosine: prepare_vector's scale per row */
    /* outputs, rows x out_ld: float values (KnnExact) or double distances */
    float *out_float = nullptr;
    double *out_double = nullptr;
    int32_t to_distance = 0; /* Keys mode: write score_to_distance(metric, score) */
    uint64_t *out_ids = nullptr;
    /* optional, rows x out_ld (Keys and SqlDistance): score_to_distance of
     * the key's score each output was selected by (Keys mode: what
     * out_double gets), +inf for padding */
    double *out_adc_double = nullptr;
    int64_t out_ld = 0;
};

void rescore_and_sort(Resources &res, const RescoreArgs &a);

/* Whether rescore_and_sort can choose a row's candidates among `runs` sorted
 * runs of `candidates` keys itself (else select_keys merges them first). */
bool rescore_takes_runs(const Resources &res, int runs, int candidates);

}  // namespace gpuivf_cuda

#endif /* GPUIVF_CUDA_RESCORE_H */
