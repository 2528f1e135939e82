/*
 * options.cpp — the automatic index options and code sizes, shared by every
 * layer so an index built anywhere has the same shape.
 */
#include <cmath>

#include "core_internal.h"

namespace gpuivf {

int pq_code_size(int m, int nbits) noexcept { return nbits == 4 ? (m + 1) / 2 : m; }

int pq_auto_m(int d) noexcept {
    if (d < 1) return 1;
    int limit = d / 4;
    if (limit < 1) limit = 1;
    if (limit > 96) limit = 96;
    for (int m = limit; m > 1; m--)
        if (d % m == 0) return m;
    return 1;
}

int auto_lists(int64_t rows) noexcept {
    int64_t lists;
    if (rows <= 1000000)
        lists = rows / 1000;
    else
        lists = static_cast<int64_t>(std::sqrt(static_cast<double>(rows)));
    if (lists < 1) lists = 1;
    if (lists > kMaxLists) lists = kMaxLists;
    return static_cast<int>(lists);
}

}  // namespace gpuivf
