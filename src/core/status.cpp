/*
 * status.cpp — Status construction.  Messages are formatted into the fixed
 * buffer of Status, so reporting an error never allocates.
 */
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "core_internal.h"

namespace gpuivf {

Status status_ok() noexcept {
    Status s;
    s.code = kOk;
    s.message[0] = '\0';
    return s;
}

Status status_error(int32_t code, const char *fmt, ...) noexcept {
    Status s;
    s.code = code;
    va_list ap;
    va_start(ap, fmt);
    int len = std::vsnprintf(s.message, sizeof(s.message), fmt, ap);
    va_end(ap);
    if (len < 0) std::strcpy(s.message, "unknown error");
    return s;
}

namespace detail {

Status canceled_status() noexcept { return status_error(kCanceled, "canceled"); }

Status out_of_memory_status(const char *what) noexcept {
    return status_error(kOutOfMemory, "out of memory in %s", what);
}

Status internal_error_status(const char *what) noexcept {
    return status_error(kInternal, "unexpected internal error in %s", what);
}

}  // namespace detail
}  // namespace gpuivf
