/*
 * topk.cpp — k-selection: a bounded max-heap over caller-owned arrays (so it
 * can live in palloc'd memory), and sorting of (score, id) pairs.
 *
 * The heap's root is the worst kept pair; a candidate enters only when it is
 * better than the root under detail::pair_less, so ties at the boundary are
 * resolved by smaller id and the result never depends on arrival order.
 */
#include <algorithm>
#include <limits>
#include <numeric>

#include "core_internal.h"

namespace gpuivf {
namespace detail {

namespace {

/* Place (v, id) at pos and move it down until both children are smaller. */
template <typename Id, typename Index>
inline void sift_down(float *vals, Id *ids, Index size, Index pos, float v, Id id) noexcept {
    for (;;) {
        Index child = 2 * pos + 1;
        if (child >= size) break;
        if (child + 1 < size && pair_less(vals[child], ids[child], vals[child + 1], ids[child + 1]))
            child++;
        if (!pair_less(v, id, vals[child], ids[child])) break;
        vals[pos] = vals[child];
        ids[pos] = ids[child];
        pos = child;
    }
    vals[pos] = v;
    ids[pos] = id;
}

}  // namespace

template <typename Id>
void heap_push(float *vals, Id *ids, int k, int *size, float v, Id id) noexcept {
    if (k <= 0) return;
    if (*size < k) {
        /* Sift up. */
        int pos = (*size)++;
        while (pos > 0) {
            int parent = (pos - 1) / 2;
            if (!pair_less(vals[parent], ids[parent], v, id)) break;
            vals[pos] = vals[parent];
            ids[pos] = ids[parent];
            pos = parent;
        }
        vals[pos] = v;
        ids[pos] = id;
        return;
    }
    if (!pair_less(v, id, vals[0], ids[0])) return;
    sift_down(vals, ids, *size, 0, v, id);
}

template <typename Id>
void heap_sort(float *vals, Id *ids, int size) noexcept {
    /* Repeatedly move the maximum to the end: ascending order in place. */
    for (int end = size - 1; end > 0; end--) {
        float v = vals[end];
        Id id = ids[end];
        vals[end] = vals[0];
        ids[end] = ids[0];
        sift_down(vals, ids, end, 0, v, id);
    }
}

template void heap_push<uint64_t>(float *, uint64_t *, int, int *, float, uint64_t) noexcept;
template void heap_push<int32_t>(float *, int32_t *, int, int *, float, int32_t) noexcept;
template void heap_sort<uint64_t>(float *, uint64_t *, int) noexcept;
template void heap_sort<int32_t>(float *, int32_t *, int) noexcept;

}  // namespace detail

void topk_init(TopK *t, float *vals, uint64_t *ids, int k) noexcept {
    t->vals = vals;
    t->ids = ids;
    t->k = k < 0 ? 0 : k;
    t->size = 0;
}

float topk_threshold(const TopK *t) noexcept {
    if (t->size < t->k) return std::numeric_limits<float>::infinity();
    if (t->k == 0) return -std::numeric_limits<float>::infinity();
    return t->vals[0];
}

void topk_push(TopK *t, float val, uint64_t id) noexcept {
    detail::heap_push(t->vals, t->ids, t->k, &t->size, val, id);
}

void topk_sort(TopK *t) noexcept { detail::heap_sort(t->vals, t->ids, t->size); }

void sort_pairs(float *vals, uint64_t *ids, int64_t n) noexcept {
    if (n <= 1) return;
    /* In-place heapsort: no allocation, O(n log n), and the total order of
     * pair_less makes the result unique. */
    for (int64_t i = n / 2 - 1; i >= 0; i--) detail::sift_down(vals, ids, n, i, vals[i], ids[i]);
    for (int64_t end = n - 1; end > 0; end--) {
        float v = vals[end];
        uint64_t id = ids[end];
        vals[end] = vals[0];
        ids[end] = ids[0];
        detail::sift_down(vals, ids, end, int64_t{0}, v, id);
    }
}

}  // namespace gpuivf
