// The GPU IVF-PQ index against the CPU engine on the same model: encoding
// (byte-identical codes), search in per-list table mode (bit-identical
// distances and the same ids), the decomposed tables (same neighbours up to
// float rounding), exact re-rank, per-query k and nprobe, small batches
// (probes split over blocks + the second selection pass, and the least
// probes a block), 4-bit codes,
// the conflict-free 8-bit scan at several code widths and with two queries
// a block, appending and
// removing, two searches in flight on two streams, recorded searches
// (CUDA graphs) replayed, the ADC distances of re-ranked entries, and
// siftsmall.
#include "cuda_test_util.h"

namespace {

using gpuivf::Metric;

struct GpuIndex {
    gpuivf_cuda_index *ix = nullptr;
    ~GpuIndex() {
        if (ix) gpuivf_cuda_index_destroy(ix);
    }
};

// Load the CPU model's entries (rows) into a fresh GPU index.
void load(const gt::CpuIvfPq &cpu, bool vectors, GpuIndex *g) {
    gpuivf_cuda_model model = cpu.gpu_model();
    EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, vectors ? 1 : 0, &g->ix));
    EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g->ix, cpu.size(), cpu.lists.data(), cpu.codes.data(),
                                                cpu.ids.data(), vectors ? cpu.raw.data() : nullptr));
}

struct Case {
    int k, nprobe, rerank, lut_mode;
};

// Search nq queries on both engines and compare.  exact: the same ids and
// the same distance bits; otherwise the same neighbours up to rounding.
void compare_search(const gt::CpuIvfPq &cpu, gpuivf_cuda_index *ix, const std::vector<float> &q, const Case &c,
                    bool exact, const std::vector<int32_t> *qk = nullptr, const std::vector<int32_t> *qnp = nullptr,
                    const std::vector<bool> *removed = nullptr) {
    SCOPED_TRACE(::testing::Message() << "metric " << static_cast<int>(cpu.metric) << " nbits " << cpu.nbits
                                      << " m " << cpu.m << " k " << c.k << " nprobe " << c.nprobe << " rerank "
                                      << c.rerank << " lut " << c.lut_mode);
    const int d = cpu.d;
    const int64_t nq = static_cast<int64_t>(q.size()) / d;
    gpuivf_cuda_search_params p{c.k, c.nprobe, c.rerank, c.lut_mode, qk ? qk->data() : nullptr,
                                qnp ? qnp->data() : nullptr};
    std::vector<double> dist(nq * c.k);
    std::vector<uint64_t> ids(nq * c.k);
    gt::poison_nan(dist);
    gt::poison(ids);
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), ix, q.data(), nq, &p, dist.data(), ids.data()));
    int64_t mismatches = 0, found = 0, total = 0;
    for (int64_t i = 0; i < nq; i++) {
        const int k = qk ? (*qk)[i] : c.k;
        const int np = qnp ? (*qnp)[i] : c.nprobe;
        auto ref = cpu.search(&q[i * d], k, np, c.rerank, removed);
        for (int j = 0; j < c.k; j++) {
            const double dv = dist[i * c.k + j];
            const uint64_t id = ids[i * c.k + j];
            if (j >= static_cast<int>(ref.size())) {
                if (!(std::isinf(dv) && id == UINT64_MAX) && mismatches++ < 5)
                    ADD_FAILURE() << "query " << i << " rank " << j << ": expected padding, got (" << dv << ", "
                                  << id << ")";
                continue;
            }
            if (removed && id != UINT64_MAX && (*removed)[(id - 3) / 7]) ADD_FAILURE() << "removed id " << id;
            if (exact) {
                if ((id != ref[j].second || !gt::same_bits(dv, ref[j].first)) && mismatches++ < 5)
                    ADD_FAILURE() << "query " << i << " rank " << j << ": gpu (" << dv << ", " << id << ") cpu ("
                                  << ref[j].first << ", " << ref[j].second << ")";
            } else {
                const double tol = 1e-4 * (1.0 + std::fabs(ref[j].first));
                if (std::fabs(dv - ref[j].first) > tol && mismatches++ < 5)
                    ADD_FAILURE() << "query " << i << " rank " << j << ": gpu distance " << dv << " cpu "
                                  << ref[j].first;
                total++;
                for (const auto &r : ref) found += r.second == id;
            }
        }
    }
    EXPECT_EQ(mismatches, 0);
    if (!exact && total > 0) EXPECT_GE(static_cast<double>(found) / total, 0.97);
}

class IvfPqTest : public ::testing::TestWithParam<std::tuple<Metric, int>> {};

TEST_P(IvfPqTest, EncodeIsByteIdentical) {
    REQUIRE_GPU();
    const Metric m = std::get<0>(GetParam());
    const int nbits = std::get<1>(GetParam());
    // Odd m: a lone low nibble at 4 bits, the CPU's tail sum at 8 bits.
    const int d = 45, pq_m = nbits == 8 ? 15 : 9;
    gt::CpuIvfPq cpu;
    cpu.train(m, gt::clustered_vectors(5003, d, 40, 11), d, 37, pq_m, nbits);
    gpuivf_cuda_model model = cpu.gpu_model();
    std::vector<int32_t> lists(cpu.size());
    std::vector<uint8_t> codes(cpu.size() * cpu.code_size);
    gt::poison(lists);
    gt::poison(codes);
    EXPECT_GPU_OK(gpuivf_cuda_ivfpq_encode(gt::gpu(), &model, cpu.raw.data(), cpu.size(), lists.data(), codes.data()));
    int64_t list_diff = 0, code_diff = 0;
    for (int64_t i = 0; i < cpu.size(); i++) {
        if (lists[i] != cpu.lists[i]) {
            // Only a near tie between two centroids may go either way.
            list_diff++;
            const float *x = &cpu.prepared[i * d];
            const float a = gpuivf::l2_squared(x, &cpu.centroids[lists[i] * d], d);
            const float b = gpuivf::l2_squared(x, &cpu.centroids[cpu.lists[i] * d], d);
            EXPECT_NEAR(a, b, 1e-4 * (1.0 + b)) << "vector " << i;
            continue;
        }
        code_diff += std::memcmp(&codes[i * cpu.code_size], &cpu.codes[i * cpu.code_size], cpu.code_size) != 0;
    }
    EXPECT_LE(list_diff, cpu.size() / 1000);
    EXPECT_EQ(code_diff, 0);
    // The ADC sums of odd m follow the CPU's order too (per-list tables, and
    // the 4-bit scan's inner product tables).
    GpuIndex g;
    load(cpu, false, &g);
    const std::vector<float> q = gt::clustered_vectors(40, d, 40, 12);
    compare_search(cpu, g.ix, q, {10, 5, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {10, 5, 0, GPUIVF_CUDA_LUT_AUTO}, m == Metric::InnerProduct && nbits == 4);
}

TEST_P(IvfPqTest, SearchMatchesCpu) {
    REQUIRE_GPU();
    const Metric m = std::get<0>(GetParam());
    const int nbits = std::get<1>(GetParam());
    const int d = 64;
    gt::CpuIvfPq cpu;
    cpu.train(m, gt::clustered_vectors(20011, d, 80, 21), d, 61, nbits == 8 ? 16 : 32, nbits);
    GpuIndex g;
    load(cpu, true, &g);
    const std::vector<float> q = gt::clustered_vectors(203, d, 80, 22);
    // Bit-identical: per-list tables (and inner product with 4-bit codes,
    // whose scan sums in the CPU's order; the 8-bit scan sums in its own).
    compare_search(cpu, g.ix, q, {10, 8, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {1, 1, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {100, 61, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {10, 8, 200, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {1000, 20, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    // Decomposed tables: same neighbours up to rounding (exact with re-rank).
    const bool ip4 = m == Metric::InnerProduct && nbits == 4;
    compare_search(cpu, g.ix, q, {10, 8, 0, GPUIVF_CUDA_LUT_AUTO}, ip4);
    compare_search(cpu, g.ix, q, {100, 16, 0, GPUIVF_CUDA_LUT_DECOMPOSED}, ip4);
    compare_search(cpu, g.ix, q, {10, 16, 100, GPUIVF_CUDA_LUT_AUTO}, false);
    // A small batch: probes split over several blocks, merged by a second pass.
    const std::vector<float> q3(q.begin(), q.begin() + 3 * d);
    compare_search(cpu, g.ix, q3, {10, 32, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q3, {100, 61, 300, GPUIVF_CUDA_LUT_PER_LIST}, true);
}

std::string param_name(const ::testing::TestParamInfo<IvfPqTest::ParamType> &info) {
    static const char *const names[] = {"", "L2", "IP", "Cosine"};
    return std::string(names[static_cast<int>(std::get<0>(info.param))]) + "_" +
           std::to_string(std::get<1>(info.param)) + "bit";
}

INSTANTIATE_TEST_SUITE_P(MetricsAndBits, IvfPqTest,
                         ::testing::Combine(::testing::Values(Metric::L2, Metric::InnerProduct, Metric::Cosine),
                                            ::testing::Values(8, 4)),
                         param_name);

// The conflict-free 8-bit scan (ivfpq_scan8.cuh) at code widths that fill
// its 32-lane steps exactly (m 32, 64), half (m 16, 48: half the lanes idle in
// the last step, table rows padded to 32) and an odd m (tail of zeros), with
// list sizes that are not multiples of its 32-code tiles.
TEST(IvfPq, ConflictFreeScanWidths) {
    REQUIRE_GPU();
    const int d = 96;
    const std::vector<float> base = gt::clustered_vectors(9001, d, 60, 61);
    const std::vector<float> q = gt::clustered_vectors(120, d, 60, 62);
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        for (int pq_m : {32, 48, 16, 24, 96}) {
            SCOPED_TRACE(::testing::Message() << "pq_m " << pq_m);
            gt::CpuIvfPq cpu;
            cpu.train(metric, base, d, 37, pq_m, 8);
            GpuIndex g;
            load(cpu, true, &g);
            compare_search(cpu, g.ix, q, {10, 6, 0, GPUIVF_CUDA_LUT_AUTO}, false);
            compare_search(cpu, g.ix, q, {100, 37, 0, GPUIVF_CUDA_LUT_AUTO}, false);
            compare_search(cpu, g.ix, q, {10, 6, 50, GPUIVF_CUDA_LUT_AUTO}, false);
            // three queries: probes split over blocks, second selection pass
            const std::vector<float> q3(q.begin(), q.begin() + 3 * d);
            compare_search(cpu, g.ix, q3, {32, 20, 0, GPUIVF_CUDA_LUT_AUTO}, false);
        }
    }
}

// Tables of m <= 32 let the 8-bit scan put two queries in one block
// (ivfpq_scan8_pairs), each half of the block on its own: a query searched
// alone (the other half empty) and the same query inside batches of odd and
// even sizes (the last block of an odd batch half empty) give the same ids
// and distance bits.
TEST(IvfPq, PairedScanMatchesSingleQueries) {
    REQUIRE_GPU();
    const int d = 64;
    const std::vector<float> base = gt::clustered_vectors(7001, d, 40, 71);
    const std::vector<float> q = gt::clustered_vectors(9, d, 40, 72);
    for (Metric metric : {Metric::L2, Metric::InnerProduct}) {
        for (int pq_m : {32, 16}) {
            SCOPED_TRACE(::testing::Message() << "metric " << static_cast<int>(metric) << " pq_m " << pq_m);
            gt::CpuIvfPq cpu;
            cpu.train(metric, base, d, 29, pq_m, 8);
            GpuIndex g;
            load(cpu, false, &g);
            for (int k : {10, 64}) {
                gpuivf_cuda_search_params p{k, 11, 0, GPUIVF_CUDA_LUT_AUTO, nullptr, nullptr};
                for (int64_t nq : {9, 8}) {
                    std::vector<double> db(nq * k);
                    std::vector<uint64_t> ib(nq * k);
                    gt::poison_nan(db);
                    gt::poison(ib);
                    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, db.data(), ib.data()));
                    for (int64_t i = 0; i < nq; i++) {
                        std::vector<double> d1(k);
                        std::vector<uint64_t> i1(k);
                        gt::poison_nan(d1);
                        gt::poison(i1);
                        EXPECT_GPU_OK(
                            gpuivf_cuda_index_search(gt::gpu(), g.ix, &q[i * d], 1, &p, d1.data(), i1.data()));
                        for (int j = 0; j < k; j++) {
                            EXPECT_EQ(ib[i * k + j], i1[j]) << "nq " << nq << " k " << k << " query " << i << " rank " << j;
                            EXPECT_TRUE(gt::same_bits(db[i * k + j], d1[j]))
                                << "nq " << nq << " k " << k << " query " << i << " rank " << j;
                        }
                    }
                }
            }
        }
    }
}

TEST(IvfPq, PerQueryKAndNprobe) {
    REQUIRE_GPU();
    const int d = 32;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(8000, d, 50, 31), d, 40, 8, 8);
    GpuIndex g;
    load(cpu, true, &g);
    const std::vector<float> q = gt::clustered_vectors(150, d, 50, 32);
    std::vector<int32_t> qk(150), qnp(150);
    std::mt19937 gen(5);
    for (int i = 0; i < 150; i++) {
        qk[i] = 1 + static_cast<int>(gen() % 120);
        qnp[i] = 1 + static_cast<int>(gen() % 40);
    }
    compare_search(cpu, g.ix, q, {120, 40, 0, GPUIVF_CUDA_LUT_PER_LIST}, true, &qk, &qnp);
    compare_search(cpu, g.ix, q, {120, 40, 150, GPUIVF_CUDA_LUT_PER_LIST}, true, &qk, &qnp);
}

// Lists longer than the scan's collect buffer (ivfpq_scan.cuh: 2,048 keys,
// cut to the k best when a step might overflow it), one list a block, for
// the k-buckets that collect (k 100, 256 and the GPU worker's 200
// candidates) and one that does not (10), then the re-rank's choice among the
// split runs:
// the CPU's bits.
TEST(IvfPq, CollectCutsLongLists) {
    REQUIRE_GPU();
    const int d = 16;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(9001, d, 3, 33), d, 2, 4, 8);
    GpuIndex g;
    load(cpu, true, &g);
    const std::vector<float> q = gt::clustered_vectors(40, d, 3, 34);
    compare_search(cpu, g.ix, q, {10, 2, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {100, 2, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {10, 2, 200, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {256, 1, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    /* the 512 and 1024 buckets (the re-rank depths of large indexes): cuts
     * at 4 x W keys, and the bitonic sort of the runs a merge takes */
    compare_search(cpu, g.ix, q, {10, 2, 800, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {600, 2, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {1000, 1, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
}

// Per-list tables of 96 sub-quantizers (98 KB, one block a multiprocessor):
// the collecting scan runs with twice the threads a block
// (ivfpq_scan_wide_blocks), for 200 and 800 candidates, one block a query's
// probe or several probes a block, alone and in a batch: the CPU's bits.
TEST(IvfPq, WideBlocksForLargeTables) {
    REQUIRE_GPU();
    const int d = 192;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(6007, d, 30, 61), d, 6, 96, 8);
    GpuIndex g;
    load(cpu, true, &g);
    const std::vector<float> q = gt::clustered_vectors(24, d, 30, 62);
    const std::vector<float> q1(q.begin(), q.begin() + d);
    for (int rerank : {200, 800}) {
        compare_search(cpu, g.ix, q, {10, 4, rerank, GPUIVF_CUDA_LUT_PER_LIST}, true);
        compare_search(cpu, g.ix, q1, {10, 4, rerank, GPUIVF_CUDA_LUT_PER_LIST}, true);
    }
    compare_search(cpu, g.ix, q, {700, 3, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    gpuivf_cuda_search_params p{10, 6, 800, GPUIVF_CUDA_LUT_PER_LIST, nullptr, nullptr};
    std::vector<double> d0(24 * 10), d1(24 * 10);
    std::vector<uint64_t> i0(24 * 10), i1(24 * 10);
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 24, &p, d0.data(), i0.data()));
    p.min_probes_per_block = 3;
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 24, &p, d1.data(), i1.data()));
    EXPECT_EQ(i0, i1);
    EXPECT_EQ(0, std::memcmp(d0.data(), d1.data(), sizeof(double) * d0.size()));
}

// min_probes_per_block changes only how a query's probes are split over
// blocks: every setting gives the same bits, with both scans, with and
// without re-rank (200 candidates: the collecting selection), alone or in a
// batch, recorded (host arrays) or not.
TEST(IvfPq, ProbesPerBlockGiveTheSameResults) {
    REQUIRE_GPU();
    const int d = 32, k = 10;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(20000, d, 60, 91), d, 64, 8, 8);
    GpuIndex g;
    load(cpu, true, &g);
    const std::vector<float> q = gt::clustered_vectors(64, d, 60, 92);
    for (int lut : {GPUIVF_CUDA_LUT_PER_LIST, GPUIVF_CUDA_LUT_AUTO})
        for (int rerank : {0, 200, 800})
            for (int64_t nq : {1, 8, 64})
                for (int host : {0, 1}) {
                    SCOPED_TRACE(::testing::Message() << "lut " << lut << " rerank " << rerank << " nq " << nq
                                                      << " host arrays " << host);
                    gpuivf_cuda_search_params p{k, 32, rerank, lut, nullptr, nullptr};
                    p.host_arrays = host;
                    std::vector<double> d0(nq * k), d1(nq * k);
                    std::vector<uint64_t> i0(nq * k), i1(nq * k);
                    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, d0.data(), i0.data()));
                    for (int mpb : {1, 2, 4, 32, 1024}) {
                        p.min_probes_per_block = mpb;
                        gt::poison_nan(d1);
                        gt::poison(i1);
                        EXPECT_GPU_OK(
                            gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, d1.data(), i1.data()));
                        EXPECT_EQ(i1, i0) << "min_probes_per_block " << mpb;
                        for (size_t i = 0; i < d1.size(); i++)
                            EXPECT_TRUE(gt::same_bits(d1[i], d0[i])) << "min_probes_per_block " << mpb << " " << i;
                    }
                    /* probes a block from the codes a kept candidate (20,000 codes in 64
                     * lists: 16 a candidate is 10 probes at 200 candidates, 1 at 10) */
                    p.min_probes_per_block = 0;
                    for (int codes : {16, 100000}) {
                        p.block_codes_per_candidate = codes;
                        gt::poison_nan(d1);
                        gt::poison(i1);
                        EXPECT_GPU_OK(
                            gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, d1.data(), i1.data()));
                        EXPECT_EQ(i1, i0) << "block_codes_per_candidate " << codes;
                        for (size_t i = 0; i < d1.size(); i++)
                            EXPECT_TRUE(gt::same_bits(d1[i], d0[i])) << "block_codes_per_candidate " << codes;
                    }
                }
    compare_search(cpu, g.ix, q, {k, 32, 200, GPUIVF_CUDA_LUT_PER_LIST}, true);
    gpuivf_cuda_search_params p{k, 32, 0, GPUIVF_CUDA_LUT_AUTO, nullptr, nullptr};
    p.min_probes_per_block = -1;
    std::vector<double> dist(k);
    std::vector<uint64_t> ids(k);
    const gpuivf_cuda_status st = gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 1, &p, dist.data(), ids.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_STREQ(st.message, "probes a block -1 is out of range 0..1024");
}

// Two searches in flight at once on two resources objects (the GPU worker's
// search streams), on the same index, with host arrays: each gives the
// synchronous search's bits; one search at a time per resources object.
TEST(IvfPq, AsyncSearchesOnTwoStreams) {
    REQUIRE_GPU();
    const int d = 32, k = 10;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(8000, d, 50, 41), d, 40, 8, 8);
    GpuIndex g;
    load(cpu, true, &g);
    gpuivf_cuda_resources *second = nullptr;
    EXPECT_GPU_OK(gpuivf_cuda_resources_create(0, 64 << 20, &second));
    const int64_t na = 37, nb = 5;
    const std::vector<float> qa = gt::clustered_vectors(na, d, 50, 42), qb = gt::clustered_vectors(nb, d, 50, 43);
    std::vector<int32_t> npa(na), npb(nb);
    for (int64_t i = 0; i < na; i++) npa[i] = 1 + static_cast<int>(i % 20);
    for (int64_t i = 0; i < nb; i++) npb[i] = 20 - static_cast<int>(i);
    gpuivf_cuda_search_params pa{k, 20, 40, GPUIVF_CUDA_LUT_PER_LIST, nullptr, npa.data()};
    gpuivf_cuda_search_params pb{k, 20, 40, GPUIVF_CUDA_LUT_PER_LIST, nullptr, npb.data()};
    std::vector<double> ref_da(na * k), ref_db(nb * k), da(na * k), db(nb * k);
    std::vector<uint64_t> ref_ia(na * k), ref_ib(nb * k), ia(na * k), ib(nb * k);
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, qa.data(), na, &pa, ref_da.data(), ref_ia.data()));
    EXPECT_GPU_OK(gpuivf_cuda_index_search(second, g.ix, qb.data(), nb, &pb, ref_db.data(), ref_ib.data()));
    for (int round = 0; round < 3; round++) {
        gt::poison_nan(da);
        gt::poison_nan(db);
        gt::poison(ia);
        gt::poison(ib);
        EXPECT_GPU_OK(gpuivf_cuda_index_search_async(gt::gpu(), g.ix, qa.data(), na, &pa, da.data(), ia.data()));
        EXPECT_GPU_OK(gpuivf_cuda_index_search_async(second, g.ix, qb.data(), nb, &pb, db.data(), ib.data()));
        // a second search on a busy resources object is refused, not queued
        std::vector<double> dx(k);
        std::vector<uint64_t> ix(k);
        EXPECT_EQ(gpuivf_cuda_index_search(second, g.ix, qb.data(), 1, &pb, dx.data(), ix.data()).code,
                  GPUIVF_CUDA_INVALID_ARGUMENT);
        int32_t done = 0;
        for (int spin = 0; spin < 10000000 && !done; spin++) EXPECT_GPU_OK(gpuivf_cuda_search_done(second, &done));
        EXPECT_EQ(done, 1);
        EXPECT_GPU_OK(gpuivf_cuda_search_wait(second));
        EXPECT_GPU_OK(gpuivf_cuda_search_wait(gt::gpu()));
        EXPECT_GPU_OK(gpuivf_cuda_search_wait(gt::gpu())); // nothing pending: a no-op
        EXPECT_EQ(ia, ref_ia);
        EXPECT_EQ(ib, ref_ib);
        for (size_t i = 0; i < da.size(); i++) EXPECT_TRUE(gt::same_bits(da[i], ref_da[i])) << "a " << i;
        for (size_t i = 0; i < db.size(); i++) EXPECT_TRUE(gt::same_bits(db[i], ref_db[i])) << "b " << i;
    }
    gpuivf_cuda_resources_destroy(second);
}

// Searches from host arrays are recorded as CUDA graphs on the first search
// of a shape and replayed after (search_graph.cu).  Against resources that
// never record: the same bits for new queries and per-query k and nprobe
// each round, shapes interleaved (their pinned places overlap), the
// asynchronous calls, more shapes than are kept (eviction), and an append
// (the index version changes: the next search is recorded anew and finds
// the new entries), for all three metrics.
TEST(IvfPq, RecordedSearchesReplay) {
    REQUIRE_GPU();
    const int d = 40, k = 10;
    gpuivf_cuda_resources *plain = nullptr;
    EXPECT_GPU_OK(gpuivf_cuda_resources_create(0, 64 << 20, &plain));
    EXPECT_GPU_OK(gpuivf_cuda_set_search_graphs(plain, 0));
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(::testing::Message() << "metric " << static_cast<int>(metric));
        gt::CpuIvfPq cpu;
        cpu.train(metric, gt::clustered_vectors(7001, d, 40, 71), d, 29, 10, 8);
        const int64_t first = cpu.size() - 500;
        gpuivf_cuda_model model = cpu.gpu_model();
        GpuIndex g;
        EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 1, &g.ix));
        EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, first, cpu.lists.data(), cpu.codes.data(),
                                                    cpu.ids.data(), cpu.raw.data()));
        const std::vector<float> q = gt::clustered_vectors(200, d, 40, 72);
        std::mt19937 gen(73);
        // one search on both resources, same bits
        auto check = [&](int64_t q0, int64_t nq, int lut, bool async) {
            SCOPED_TRACE(::testing::Message() << "q0 " << q0 << " nq " << nq << " lut " << lut << " async " << async);
            std::vector<int32_t> qk(nq), qnp(nq);
            for (int64_t i = 0; i < nq; i++) {
                qk[i] = 1 + static_cast<int>(gen() % k);
                qnp[i] = 1 + static_cast<int>(gen() % 12);
            }
            gpuivf_cuda_search_params p{k, 12, 30, lut, qk.data(), qnp.data()};
            std::vector<double> dr(nq * k), dg(nq * k);
            std::vector<uint64_t> ir(nq * k), ig(nq * k);
            gt::poison_nan(dg);
            gt::poison(ig);
            EXPECT_GPU_OK(gpuivf_cuda_index_search(plain, g.ix, &q[q0 * d], nq, &p, dr.data(), ir.data()));
            if (async) {
                EXPECT_GPU_OK(gpuivf_cuda_index_search_async(gt::gpu(), g.ix, &q[q0 * d], nq, &p, dg.data(),
                                                             ig.data()));
                EXPECT_GPU_OK(gpuivf_cuda_search_wait(gt::gpu()));
            } else {
                EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, &q[q0 * d], nq, &p, dg.data(), ig.data()));
            }
            EXPECT_EQ(ig, ir);
            for (size_t i = 0; i < dg.size(); i++) EXPECT_TRUE(gt::same_bits(dg[i], dr[i])) << i;
        };
        for (int round = 0; round < 3; round++) {
            check(round * 16, 16, GPUIVF_CUDA_LUT_PER_LIST, round == 2);
            check(100 + round * 5, 5, GPUIVF_CUDA_LUT_PER_LIST, false);
            check(150, 16, GPUIVF_CUDA_LUT_AUTO, round == 1);
        }
        // more shapes than a resources object keeps, then the first again
        for (int64_t nq = 1; nq <= 70; nq++) check(0, nq, GPUIVF_CUDA_LUT_PER_LIST, nq % 2 == 0);
        check(16, 16, GPUIVF_CUDA_LUT_PER_LIST, false);
        // the rest of the rows arrive: found by the very next search
        EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, cpu.size() - first, &cpu.lists[first],
                                                    &cpu.codes[first * cpu.code_size], &cpu.ids[first],
                                                    &cpu.raw[first * d]));
        check(0, 16, GPUIVF_CUDA_LUT_PER_LIST, false);
        compare_search(cpu, g.ix, std::vector<float>(q.begin(), q.begin() + 16 * d),
                       {k, 12, 30, GPUIVF_CUDA_LUT_PER_LIST}, true);
    }
    gpuivf_cuda_resources_destroy(plain);
}

// The params' out_adc_distances (the GPU worker's shard merge needs both
// distances of a re-ranked entry): with re-rank R and k = R, a search returns
// the entries a search without re-rank (k = R) returns, and each one's ADC
// distance is, bit for bit, the distance that search gives it; with a
// per-query k below k, the best of them, padded with +inf in both outputs.
// Without re-rank the ADC distances are the distances.  Asking for them
// changes no other output.  Both table modes, all three metrics; one query
// and three (probes split over blocks: the re-rank chooses among the runs,
// or, with R = 256, among them merged first), 300 (a recorded search) and
// 2,000 (one block a query, never recorded); synchronously (recorded, then
// replayed, with and without the ADC output in turns: two graphs),
// asynchronously, on resources that never record, and from device memory.
TEST(IvfPq, AdcDistancesOfRerankedEntries) {
    REQUIRE_GPU();
    const int d = 32;
    gpuivf_cuda_resources *plain = nullptr;
    EXPECT_GPU_OK(gpuivf_cuda_resources_create(0, 64 << 20, &plain));
    EXPECT_GPU_OK(gpuivf_cuda_set_search_graphs(plain, 0));
    const std::vector<float> q = gt::clustered_vectors(2000, d, 50, 82);
    // Sync and Async: gt::gpu() (records and replays), Async with the
    // host_arrays promise; Plain: never recorded; Device: device arrays.
    enum class Via { Sync, Async, Plain, Device };
    struct Out {
        std::vector<double> dist, adc;
        std::vector<uint64_t> ids;
    };
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        gt::CpuIvfPq cpu;
        cpu.train(metric, gt::clustered_vectors(6000, d, 50, 81), d, 40, 8, 8);
        GpuIndex g;
        load(cpu, true, &g);
        auto search = [&](int64_t nq, int k, int nprobe, int rerank, int lut, const std::vector<int32_t> *qk, Via via,
                          bool adc, Out *o) {
            o->dist.resize(nq * k);
            o->ids.resize(nq * k);
            o->adc.resize(adc ? nq * k : 0);
            gt::poison_nan(o->dist);
            gt::poison(o->ids);
            gt::poison_nan(o->adc);
            gpuivf_cuda_search_params p{k, nprobe, rerank, lut, qk ? qk->data() : nullptr, nullptr,
                                        via == Via::Async ? 1 : 0, adc ? o->adc.data() : nullptr};
            if (via == Via::Sync) {
                EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, o->dist.data(), o->ids.data()));
            } else if (via == Via::Async) {
                EXPECT_GPU_OK(
                    gpuivf_cuda_index_search_async(gt::gpu(), g.ix, q.data(), nq, &p, o->dist.data(), o->ids.data()));
                EXPECT_GPU_OK(gpuivf_cuda_search_wait(gt::gpu()));
            } else if (via == Via::Plain) {
                EXPECT_GPU_OK(gpuivf_cuda_index_search(plain, g.ix, q.data(), nq, &p, o->dist.data(), o->ids.data()));
            } else {
                void *dq = nullptr, *dd = nullptr, *di = nullptr, *da = nullptr;
                const int64_t nout = nq * k;
                EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), 4 * nq * d, &dq));
                EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), 8 * nout, &dd));
                EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), 8 * nout, &di));
                EXPECT_GPU_OK(gpuivf_cuda_malloc(gt::gpu(), 8 * nout, &da));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), dq, q.data(), 4 * nq * d));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), dd, o->dist.data(), 8 * nout));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), di, o->ids.data(), 8 * nout));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), da, o->dist.data(), 8 * nout));
                p.out_adc_distances = adc ? static_cast<double *>(da) : nullptr;
                EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, static_cast<const float *>(dq), nq, &p,
                                                       static_cast<double *>(dd), static_cast<uint64_t *>(di)));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), o->dist.data(), dd, 8 * nout));
                EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), o->ids.data(), di, 8 * nout));
                if (adc) EXPECT_GPU_OK(gpuivf_cuda_memcpy(gt::gpu(), o->adc.data(), da, 8 * nout));
                for (void *ptr : {dq, dd, di, da}) EXPECT_GPU_OK(gpuivf_cuda_free(gt::gpu(), ptr));
            }
        };
        auto padding = [](double v, uint64_t id) { return std::isinf(v) && v > 0 && id == UINT64_MAX; };
        auto check = [&](int64_t nq, int R, int nprobe, int lut, bool per_query_k) {
            SCOPED_TRACE(::testing::Message() << "metric " << static_cast<int>(metric) << " nq " << nq << " R " << R
                                              << " nprobe " << nprobe << " lut " << lut << " per-query k "
                                              << per_query_k);
            std::vector<int32_t> qk;
            for (int64_t i = 0; per_query_k && i < nq; i++) qk.push_back(1 + static_cast<int>((i * 7 + 3) % R));
            const std::vector<int32_t> *qkp = per_query_k ? &qk : nullptr;
            // the ADC order: no re-rank, k = R
            Out ref;
            search(nq, R, nprobe, 0, lut, nullptr, Via::Plain, true, &ref);
            for (size_t i = 0; i < ref.dist.size(); i++)
                ASSERT_TRUE(gt::same_bits(ref.adc[i], ref.dist[i])) << "no re-rank, slot " << i;
            // the re-ranked search without the ADC output
            Out base;
            search(nq, R, nprobe, R, lut, qkp, Via::Plain, false, &base);
            const std::pair<Via, bool> runs[] = {{Via::Sync, false}, {Via::Sync, true},   {Via::Sync, true},
                                                 {Via::Sync, false}, {Via::Async, true},  {Via::Async, false},
                                                 {Via::Async, true}, {Via::Plain, true},  {Via::Device, true}};
            for (const auto &run : runs) {
                SCOPED_TRACE(::testing::Message() << "via " << static_cast<int>(run.first) << " adc " << run.second);
                Out o;
                search(nq, R, nprobe, R, lut, qkp, run.first, run.second, &o);
                ASSERT_EQ(o.ids, base.ids);
                for (size_t i = 0; i < o.dist.size(); i++) ASSERT_TRUE(gt::same_bits(o.dist[i], base.dist[i])) << i;
                if (!run.second) continue;
                int64_t mismatches = 0;
                for (int64_t i = 0; i < nq; i++) {
                    const int kq = per_query_k ? qk[i] : R;
                    int returned = 0, adc_entries = 0;
                    for (int j = 0; j < R; j++) {
                        const int64_t s = i * R + j;
                        if (j >= kq || o.ids[s] == UINT64_MAX) {
                            if (!padding(o.dist[s], o.ids[s]) || !padding(o.adc[s], o.ids[s])) mismatches++;
                            continue;
                        }
                        returned++;
                        const double *want = nullptr;
                        for (int t = 0; t < R; t++)
                            if (ref.ids[i * R + t] == o.ids[s]) want = &ref.dist[i * R + t];
                        if (!want || !gt::same_bits(o.adc[s], *want)) {
                            if (mismatches++ < 5)
                                ADD_FAILURE() << "query " << i << " rank " << j << " id " << o.ids[s] << ": adc "
                                              << o.adc[s] << ", without re-rank " << (want ? *want : NAN);
                        }
                    }
                    for (int t = 0; t < R; t++) adc_entries += ref.ids[i * R + t] != UINT64_MAX;
                    // the same entries (ids are distinct): as many, each found above
                    EXPECT_EQ(returned, std::min(kq, adc_entries)) << "query " << i;
                }
                EXPECT_EQ(mismatches, 0);
            }
            // without re-rank (and per-query k): the ADC distances are the distances
            for (Via via : {Via::Sync, Via::Sync, Via::Async, Via::Plain, Via::Device}) {
                Out o;
                search(nq, R, nprobe, 0, lut, qkp, via, true, &o);
                for (size_t i = 0; i < o.dist.size(); i++)
                    ASSERT_TRUE(gt::same_bits(o.adc[i], o.dist[i])) << "via " << static_cast<int>(via) << " slot " << i;
                for (int64_t i = 0; per_query_k && i < nq; i++)
                    for (int j = qk[i]; j < R; j++) ASSERT_TRUE(padding(o.adc[i * R + j], o.ids[i * R + j]));
            }
        };
        for (int lut : {GPUIVF_CUDA_LUT_PER_LIST, GPUIVF_CUDA_LUT_DECOMPOSED}) {
            check(1, 40, 16, lut, false);
            check(3, 40, 16, lut, false);
            check(3, 40, 16, lut, true);
            check(1, 256, 40, lut, false);
            check(300, 40, 16, lut, false);
            check(300, 40, 16, lut, true);
            check(2000, 40, 16, lut, false);
            check(2000, 40, 16, lut, true);
        }
    }
    gpuivf_cuda_resources_destroy(plain);
}

// Half-precision stored vectors (pgvector's halfvec): the re-rank reads the
// halves and computes the distances of their exact widening, which are the
// CPU's distances of those values (bit for bit), in half the memory of a
// float32 copy; appending and removing keep them.
TEST(IvfPq, HalfVectorsRerankAsTheirWidenedValues) {
    REQUIRE_GPU();
    for (Metric m : {Metric::L2, Metric::InnerProduct, Metric::Cosine}) {
        SCOPED_TRACE(static_cast<int>(m));
        const int d = 96;
        // a halfvec's values: the generated rows rounded to half precision
        std::vector<float> x = gt::clustered_vectors(12007, d, 60, 31);
        std::vector<uint16_t> h(x.size());
        gpuivf::float_to_half_n(x.data(), h.data(), static_cast<int64_t>(x.size()));
        gpuivf::half_to_float_n(h.data(), x.data(), static_cast<int64_t>(x.size()));
        gt::CpuIvfPq cpu;
        cpu.train(m, x, d, 41, 24, 8);
        gpuivf_cuda_model model = cpu.gpu_model();
        GpuIndex half;
        EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, GPUIVF_CUDA_VECTORS_FLOAT16, &half.ix));
        EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), half.ix, cpu.size(), cpu.lists.data(),
                                                    cpu.codes.data(), cpu.ids.data(), h.data()));
        std::vector<float> q = gt::clustered_vectors(150, d, 60, 32);
        std::vector<uint16_t> qh(q.size());
        gpuivf::float_to_half_n(q.data(), qh.data(), static_cast<int64_t>(q.size()));
        gpuivf::half_to_float_n(qh.data(), q.data(), static_cast<int64_t>(q.size()));
        compare_search(cpu, half.ix, q, {10, 8, 200, GPUIVF_CUDA_LUT_PER_LIST}, true);
        compare_search(cpu, half.ix, q, {100, 41, 300, GPUIVF_CUDA_LUT_PER_LIST}, true);
        const std::vector<float> q3(q.begin(), q.begin() + 3 * d);
        compare_search(cpu, half.ix, q3, {10, 32, 1000, GPUIVF_CUDA_LUT_PER_LIST}, true);

        GpuIndex full;
        load(cpu, true, &full);
        gpuivf_cuda_index_stats hs{}, fs{};
        EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(half.ix, &hs));
        EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(full.ix, &fs));
        EXPECT_LE(hs.device_bytes, fs.device_bytes - cpu.size() * d * 2) << "halves take half the vector bytes";

        // removing entries re-lays out the halves with their entries
        std::vector<uint64_t> drop;
        std::vector<bool> removed(cpu.size(), false);
        for (int64_t i = 0; i < cpu.size(); i += 3) {
            drop.push_back(cpu.ids[i]);
            removed[i] = true;
        }
        int64_t n_removed = 0;
        EXPECT_GPU_OK(gpuivf_cuda_index_remove(gt::gpu(), half.ix, static_cast<int64_t>(drop.size()), drop.data(),
                                               &n_removed));
        EXPECT_EQ(n_removed, static_cast<int64_t>(drop.size()));
        compare_search(cpu, half.ix, q, {10, 8, 200, GPUIVF_CUDA_LUT_PER_LIST}, true, nullptr, nullptr, &removed);
    }
}

TEST(IvfPq, AppendAndRemove) {
    REQUIRE_GPU();
    const int d = 32;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(9001, d, 50, 41), d, 33, 8, 8);
    gpuivf_cuda_model model = cpu.gpu_model();
    GpuIndex g;
    EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 1, &g.ix));
    // Three appends of uneven size: lists grow and are re-laid out.
    const int64_t cuts[] = {0, 100, 2500, cpu.size()};
    for (int b = 0; b < 3; b++) {
        const int64_t r0 = cuts[b], n = cuts[b + 1] - cuts[b];
        EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, n, &cpu.lists[r0], &cpu.codes[r0 * cpu.code_size],
                                                    &cpu.ids[r0], &cpu.raw[r0 * d]));
    }
    gpuivf_cuda_index_stats stats;
    EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(g.ix, &stats));
    EXPECT_EQ(stats.vectors, cpu.size());
    // Lists read back in insertion order, in the CPU's code format.
    for (int l = 0; l < cpu.nlist; l++) {
        int64_t count = 0;
        std::vector<uint64_t> ids(cpu.members[l].size());
        std::vector<uint8_t> codes(cpu.members[l].size() * cpu.code_size);
        EXPECT_GPU_OK(gpuivf_cuda_index_get_list(gt::gpu(), g.ix, l, static_cast<int64_t>(ids.size()), &count,
                                                 ids.data(), codes.data()));
        ASSERT_EQ(count, static_cast<int64_t>(cpu.members[l].size()));
        for (size_t i = 0; i < ids.size(); i++) {
            const int64_t row = cpu.members[l][i];
            ASSERT_EQ(ids[i], cpu.ids[row]);
            ASSERT_EQ(0, std::memcmp(&codes[i * cpu.code_size], &cpu.codes[row * cpu.code_size], cpu.code_size));
        }
    }
    const std::vector<float> q = gt::clustered_vectors(64, d, 50, 42);
    compare_search(cpu, g.ix, q, {20, 10, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    // Remove every third entry (and an id that is not there).
    std::vector<uint64_t> gone;
    std::vector<bool> removed(cpu.size(), false);
    for (int64_t i = 0; i < cpu.size(); i += 3) {
        gone.push_back(cpu.ids[i]);
        removed[i] = true;
    }
    gone.push_back(999999999999ull);
    int64_t count = -1;
    EXPECT_GPU_OK(gpuivf_cuda_index_remove(gt::gpu(), g.ix, static_cast<int64_t>(gone.size()), gone.data(), &count));
    EXPECT_EQ(count, static_cast<int64_t>(gone.size()) - 1);
    EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(g.ix, &stats));
    EXPECT_EQ(stats.vectors, cpu.size() - count);
    compare_search(cpu, g.ix, q, {20, 10, 0, GPUIVF_CUDA_LUT_PER_LIST}, true, nullptr, nullptr, &removed);
    compare_search(cpu, g.ix, q, {20, 10, 50, GPUIVF_CUDA_LUT_PER_LIST}, true, nullptr, nullptr, &removed);
    // Append again after the removal.
    EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, 1, &cpu.lists[0], &cpu.codes[0], &cpu.ids[0],
                                                &cpu.raw[0]));
    removed[0] = false;
    compare_search(cpu, g.ix, q, {20, 10, 0, GPUIVF_CUDA_LUT_PER_LIST}, true, nullptr, nullptr, &removed);
}

// A loaded index has headroom in every list, so appends spread over the
// lists (inserts catching a copy up) do not lay the index out again: its
// device memory stays the same until a list outgrows its 1/8.
TEST(IvfPq, AppendsFitHeadroom) {
    REQUIRE_GPU();
    const int d = 32;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, gt::clustered_vectors(8000, d, 50, 43), d, 20, 8, 8);
    gpuivf_cuda_model model = cpu.gpu_model();
    GpuIndex g;
    EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 1, &g.ix));
    EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, cpu.size(), cpu.lists.data(), cpu.codes.data(),
                                                cpu.ids.data(), cpu.raw.data()));
    gpuivf_cuda_index_stats loaded;
    EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(g.ix, &loaded));
    // one entry at a time, copies of every 16th row under new ids: each
    // list gets about 1/16 of its size
    const int64_t n = cpu.size() / 16;
    for (int64_t j = 0; j < n; j++) {
        const int64_t i = j * 16;
        const uint64_t id = 1000000 + static_cast<uint64_t>(i);
        EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, 1, &cpu.lists[i], &cpu.codes[i * cpu.code_size],
                                                    &id, &cpu.raw[i * d]));
    }
    gpuivf_cuda_index_stats after;
    EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(g.ix, &after));
    EXPECT_EQ(after.vectors, cpu.size() + n);
    EXPECT_EQ(after.device_bytes, loaded.device_bytes) << "the appends fit the lists' headroom";
    // a list that outgrows it grows, and everything is still found
    std::vector<int32_t> lists(cpu.size(), cpu.lists[0]);
    std::vector<uint64_t> ids(cpu.size());
    for (int64_t i = 0; i < cpu.size(); i++) ids[i] = 2000000 + static_cast<uint64_t>(i);
    EXPECT_GPU_OK(gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, cpu.size(), lists.data(), cpu.codes.data(),
                                                ids.data(), cpu.raw.data()));
    EXPECT_GPU_OK(gpuivf_cuda_index_get_stats(g.ix, &after));
    EXPECT_EQ(after.vectors, 2 * cpu.size() + n);
    EXPECT_GT(after.device_bytes, loaded.device_bytes);
    int64_t count = 0;
    EXPECT_GPU_OK(gpuivf_cuda_index_get_list(gt::gpu(), g.ix, cpu.lists[0], 0, &count, nullptr, nullptr));
    EXPECT_GE(count, cpu.size());
}

TEST(IvfPq, GpuEncodingAppend) {
    REQUIRE_GPU();
    const int d = 32;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::Cosine, gt::clustered_vectors(6000, d, 50, 51), d, 30, 8, 8);
    gpuivf_cuda_model model = cpu.gpu_model();
    GpuIndex g;
    EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 1, &g.ix));
    EXPECT_GPU_OK(gpuivf_cuda_index_add(gt::gpu(), g.ix, cpu.size(), cpu.raw.data(), cpu.ids.data()));
    int64_t total = 0;
    for (int l = 0; l < cpu.nlist; l++) {
        int64_t count = 0;
        EXPECT_GPU_OK(gpuivf_cuda_index_get_list(gt::gpu(), g.ix, l, 0, &count, nullptr, nullptr));
        total += count;
        EXPECT_LE(std::llabs(count - static_cast<int64_t>(cpu.members[l].size())), 3) << "list " << l;
    }
    EXPECT_EQ(total, cpu.size());
    const std::vector<float> q = gt::clustered_vectors(50, d, 50, 52);
    compare_search(cpu, g.ix, q, {10, 8, 64, GPUIVF_CUDA_LUT_AUTO}, false);
}

TEST(IvfPq, Siftsmall) {
    REQUIRE_GPU();
    gt::SiftSmall s;
    if (!gt::load_siftsmall(&s)) GTEST_SKIP() << "skipped: siftsmall not found in " << gt::data_dir();
    const std::vector<float> &q = s.queries;
    const int64_t nq = s.nq;
    gt::CpuIvfPq cpu;
    cpu.train(Metric::L2, s.base, s.d, 100, 16, 8);
    GpuIndex g;
    load(cpu, true, &g);
    compare_search(cpu, g.ix, q, {10, 10, 0, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {10, 10, 100, GPUIVF_CUDA_LUT_PER_LIST}, true);
    compare_search(cpu, g.ix, q, {10, 10, 0, GPUIVF_CUDA_LUT_AUTO}, false);
    // Recall@10 against the official ground truth (reported; re-ranked).
    const int k = 10;
    gpuivf_cuda_search_params p{k, 10, 100, GPUIVF_CUDA_LUT_AUTO, nullptr, nullptr};
    std::vector<double> dist(nq * k);
    std::vector<uint64_t> ids(nq * k);
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), nq, &p, dist.data(), ids.data()));
    int64_t hit = 0;
    for (int64_t i = 0; i < nq; i++)
        for (int j = 0; j < k; j++)
            for (int t = 0; t < k; t++) hit += ids[i * k + j] == cpu.ids[s.truth[i * s.truth_k + t]];
    const double recall = static_cast<double>(hit) / (nq * k);
    std::printf("siftsmall: recall@10 %.3f (100 lists, pq_m 16, nprobe 10, re-rank 100)\n", recall);
    EXPECT_GE(recall, 0.85);
}

TEST(IvfPq, InvalidArguments) {
    REQUIRE_GPU();
    const int d = 16;
    std::vector<float> cent(4 * d, 0.0f), cb(4 * 256 * 4, 0.0f);
    gpuivf_cuda_model model{1, d, 4, 4, 8, cent.data(), cb.data()};
    GpuIndex g;
    EXPECT_GPU_OK(gpuivf_cuda_index_create(gt::gpu(), &model, 0, &g.ix));
    std::vector<float> q(d, 1.0f);
    std::vector<double> dist(10);
    std::vector<uint64_t> ids(10);
    gpuivf_cuda_search_params p{10, 2, 50, 0, nullptr, nullptr};
    gpuivf_cuda_status st = gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 1, &p, dist.data(), ids.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_STREQ(st.message, "re-ranking needs an index that stores vectors");
    p.rerank_candidates = 0;
    p.nprobe = 0;
    st = gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 1, &p, dist.data(), ids.data());
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    // An empty index answers with padding only (ADC distances too).
    p.nprobe = 2;
    std::vector<double> adc(10);
    p.out_adc_distances = adc.data();
    gt::poison_nan(dist);
    gt::poison_nan(adc);
    EXPECT_GPU_OK(gpuivf_cuda_index_search(gt::gpu(), g.ix, q.data(), 1, &p, dist.data(), ids.data()));
    for (int i = 0; i < 10; i++) {
        EXPECT_TRUE(std::isinf(dist[i]));
        EXPECT_TRUE(std::isinf(adc[i]));
        EXPECT_EQ(ids[i], UINT64_MAX);
    }
    int32_t bad_list = 7;
    uint8_t code[4] = {};
    uint64_t id = 1;
    st = gpuivf_cuda_index_add_encoded(gt::gpu(), g.ix, 1, &bad_list, code, &id, nullptr);
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_STREQ(st.message, "list 7 is out of range 0..3");
    model.m = 5;
    gpuivf_cuda_index *other = nullptr;
    st = gpuivf_cuda_index_create(gt::gpu(), &model, 0, &other);
    EXPECT_EQ(st.code, GPUIVF_CUDA_INVALID_ARGUMENT);
    EXPECT_EQ(other, nullptr);
}

} // namespace
