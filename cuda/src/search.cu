/*
 * search.cu — batched IVF-PQ search:
 *   1. prepare the queries (unit vectors for cosine, the CPU's bits);
 *   2. coarse quantization by the exact kNN against the centroids (L2, or
 *      inner product for an IP index), re-scored with the CPU's arithmetic
 *      so the probed lists and their biases are the CPU's (a batch of the
 *      GPU worker's size scores every centroid exactly, knn.cu);
 *   3. the fused list scan + k-selection (ivfpq_scan.cuh; ivfpq_scan8.cuh
 *      for 8-bit codes with query tables), one block per
 *      query, or per share of its probes when the batch is too small to fill
 *      the GPU;
 *   4. exact re-rank of the candidates on the stored vectors (or the ADC
 *      scores as distances), sorted by (distance, id) like the CPU; with
 *      shares, the re-rank first chooses each query's candidates among the
 *      shares' runs (rescore.cu), or, where they do not fit its block, a
 *      second selection pass merges them.
 * Every query may have its own k and nprobe; the kernels are instantiated
 * for the k-bucket of the largest.
 */
#include <algorithm>
#include <vector>

#include "index.h"
#include "knn.h"
#include "rescore.h"
#include "select.h"
#include "vectors.h"

namespace gpuivf_cuda {

int search_query_ks(const SearchParams &p, int64_t nq, int32_t *qk, int32_t *kscan) {
    int kscan_max = 1;
    for (int64_t i = 0; i < nq; i++) {
        qk[i] = p.query_k ? p.query_k[i] : p.k;
        kscan[i] = p.rerank > 0 ? std::max(p.rerank, qk[i]) : qk[i];
        kscan_max = std::max(kscan_max, kscan[i]);
    }
    return kscan_max;
}

void index_search(Resources &res, Index &ix, const float *queries, int64_t nq, const SearchParams &p,
                  double *out_distances, uint64_t *out_ids) {
    if (nq <= 0) return;
    const int kout = p.k;
    const int npmax = std::min(p.nprobe, ix.nlist);
    const bool rerank = p.rerank > 0;
    const bool per_list = p.lut_mode == GPUIVF_CUDA_LUT_PER_LIST;

    std::vector<int32_t> qk(nq), kscan(nq);
    const int kscan_max = search_query_ks(p, nq, qk.data(), kscan.data());
    const int w = select_bucket(kscan_max);

    const size_t lut_bytes = sizeof(float) * (static_cast<size_t>(ix.m_pad) * ix.ksub + 2 * static_cast<size_t>(ix.d));
    /* The per-probe arrays are sized for one block's share of the probes. */
    const size_t probe_bytes_max = 12 * static_cast<size_t>(npmax + 1) + 16;
    /* 8-bit codes with query tables: the conflict-free scan (ivfpq_scan8.cuh)
     * when its larger table fits, two queries a block when that fits too.
     * The choice does not depend on the batch (one query too): a query's
     * sums are the same whatever batch it comes in. */
    const bool pairs = ivfpq_scan8_pairs(ix.m_pad, w) &&
                       ivfpq_scan8_pairs_smem_bytes(ix.d, npmax, w) <= res.smem_optin;
    const size_t smem8 = pairs ? ivfpq_scan8_pairs_smem_bytes(ix.d, npmax, w)
                               : ivfpq_scan8_smem_bytes(ix.m_pad, ix.d, npmax, ivfpq_scan_queue_bytes(w));
    const bool scan8 = !per_list && ix.nbits == 8 && smem8 <= res.smem_optin;
    const size_t smem = scan8 ? smem8
                              : ivfpq_scan_select_bytes(w) + probe_bytes_max +
                                    (ivfpq_scan_collects(w) ? lut_bytes
                                                            : std::max(lut_bytes, ivfpq_scan_merge_bytes(w)));
    GPUIVF_REQUIRE(smem <= res.smem_optin,
                   "look-up tables of %d sub-quantizers x %d codes do not fit in the GPU's shared memory", ix.m,
                   ix.ksub);

    /* the per-query arrays on the device (staged by the caller, or here) */
    TempBuffer<int32_t> own_qk, own_kscan, own_qnp;
    const int32_t *dev_qk = p.staged_qk, *dev_kscan = p.staged_kscan, *dev_qnp = p.staged_qnp;
    if (!dev_qk) {
        own_qk.allocate(res, nq);
        own_kscan.allocate(res, nq);
        stage_to_device(res, own_qk.data(), qk.data(), nq);
        stage_to_device(res, own_kscan.data(), kscan.data(), nq);
        dev_qk = own_qk.data();
        dev_kscan = own_kscan.data();
        if (p.query_nprobe) {
            own_qnp.allocate(res, nq);
            stage_to_device(res, own_qnp.data(), p.query_nprobe, nq);
            dev_qnp = own_qnp.data();
        }
    }

    const int64_t chunk = std::min<int64_t>(
        {nq, 65535, std::max<int64_t>(256, (int64_t(64) << 20) / (static_cast<int64_t>(kscan_max) * sizeof(Key)))});
    TempBuffer<float> qbuf;
    if (ix.metric == Metric::Cosine) qbuf.allocate(res, chunk * ix.d);
    TempBuffer<float> coarse_scores(res, chunk * npmax);
    TempBuffer<uint64_t> coarse_ids(res, chunk * npmax);
    TempBuffer<int32_t> probe_lists(res, chunk * npmax);

    for (int64_t q0 = 0; q0 < nq; q0 += chunk) {
        check_cancel(res);
        const int64_t rows = std::min(chunk, nq - q0);
        const float *raw = queries + q0 * ix.d;
        const float *qp = raw;
        if (ix.metric == Metric::Cosine) {
            prepare_rows(res, ix.metric, raw, rows, ix.d, qbuf.data());
            qp = qbuf.data();
        }

        /* 2. coarse quantization */
        KnnOptions o;
        o.exact_rescore = true;
        o.queries_prepared = true;
        o.out_lists = probe_lists.data();
        const Metric coarse = ix.metric == Metric::InnerProduct ? Metric::InnerProduct : Metric::L2;
        exact_knn(res, coarse, ix.centroids.data(), ix.nlist, qp, rows, ix.d, npmax, o, coarse_scores.data(),
                  coarse_ids.data());

        /* 3. scan: enough blocks for about eight per multiprocessor, with at
         * least p.min_probes_per_block probes each */
        int splits = static_cast<int>(std::min<int64_t>(npmax, std::max<int64_t>(1, ceil_div(8 * res.sm_count, rows))));
        splits = std::min(splits, static_cast<int>(ceil_div(npmax, std::max(1, p.min_probes_per_block))));
        const int pps = static_cast<int>(ceil_div(npmax, splits));
        splits = static_cast<int>(ceil_div(npmax, pps));
        TempBuffer<Key> scan_out(res, rows * splits * kscan_max);
        /* The splits' runs: the re-rank chooses among them itself when they
         * fit its block (then the collecting scan leaves them unsorted and
         * gives each run's bound), else they are merged first. */
        const bool rescore_runs = splits > 1 && rescore_takes_runs(res, splits, kscan_max);
        TempBuffer<Key> run_bounds;
        if (!scan8 && (splits == 1 || rescore_runs)) run_bounds.allocate(res, rows * splits);
        IvfPqScanArgs a;
        a.nq = static_cast<int32_t>(rows);
        a.splits = splits;
        a.probes_per_split = pps;
        a.queries = qp;
        a.d = ix.d;
        a.probe_lists = probe_lists.data();
        a.probe_bias = coarse_scores.data();
        a.probe_ld = npmax;
        a.query_nprobe = p.query_nprobe ? dev_qnp + q0 : nullptr;
        a.nprobe = npmax;
        a.query_k = dev_kscan + q0;
        a.k = kscan_max;
        a.codes = ix.codes.data();
        a.code_chunks = ix.code_chunks;
        a.term2 = ix.term2.data();
        a.list_offset = ix.d_offset.data();
        a.list_size = ix.d_size.data();
        a.codebook = ix.codebook.data();
        a.centroids = ix.centroids.data();
        a.m = ix.m;
        a.nbits = ix.nbits;
        a.dsub = ix.dsub;
        a.ksub = ix.ksub;
        a.m_pad = ix.m_pad;
        a.metric = static_cast<int32_t>(ix.metric);
        a.per_list_lut = per_list ? 1 : 0;
        a.wide_blocks = !scan8 && ivfpq_scan_wide_blocks(w, smem, res.smem_optin) ? 1 : 0;
        a.scan8 = scan8 ? 1 : 0;
        a.scan8_pairs = scan8 && pairs ? 1 : 0;
        a.codebook_t = ix.codebook_t.data();
        a.out = scan_out.data();
        a.out_ld = kscan_max;
        a.out_count = kscan_max;
        a.out_bound = run_bounds.data();
        if (ix.count > 0) {
            launch_ivfpq_scan(w, a, smem, res.stream);
        } else {
            GPUIVF_CUDA_TRY(cudaMemsetAsync(scan_out.data(), 0xff, sizeof(Key) * rows * splits * kscan_max, res.stream));
            if (run_bounds.data())
                GPUIVF_CUDA_TRY(cudaMemsetAsync(run_bounds.data(), 0xff, sizeof(Key) * rows * splits, res.stream));
        }

        const Key *cand = scan_out.data();
        TempBuffer<Key> merged;
        if (splits > 1 && !rescore_runs) {
            /* the split results are sorted runs of kscan_max keys */
            merged.allocate(res, rows * kscan_max);
            select_keys(res, scan_out.data(), rows, static_cast<int64_t>(splits) * kscan_max,
                        static_cast<int64_t>(splits) * kscan_max, dev_kscan + q0, kscan_max, merged.data(),
                        kscan_max, kscan_max, kscan_max);
            cand = merged.data();
        }

        /* 4. re-rank / final order */
        RescoreArgs r;
        r.mode = rerank ? RescoreMode::SqlDistance : RescoreMode::Keys;
        r.metric = ix.metric;
        r.keys = cand;
        r.key_ld = rescore_runs ? static_cast<int64_t>(splits) * kscan_max : kscan_max;
        r.candidates = kscan_max;
        r.runs = rescore_runs ? splits : 1;
        r.run_k = dev_kscan + q0;
        r.run_bounds = rescore_runs ? run_bounds.data() : nullptr;
        r.rows = rows;
        r.row_k = dev_qk + q0;
        r.k = kout;
        r.ids = ix.ids.data();
        r.queries = raw;
        r.d = ix.d;
        if (ix.half_vectors)
            r.vectors_half = ix.vectors.data();
        else
            r.vectors = reinterpret_cast<const float *>(ix.vectors.data());
        r.to_distance = 1;
        r.out_double = out_distances + q0 * kout;
        r.out_ids = out_ids + q0 * kout;
        r.out_adc_double = p.out_adc ? p.out_adc + q0 * kout : nullptr;
        r.out_ld = kout;
        rescore_and_sort(res, r);
    }
}

}  // namespace gpuivf_cuda
