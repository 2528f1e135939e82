/*
 * worker/bgworker/engine.cpp — the GPU engine as the worker sees it: each
 * worker dlopen()s $libdir/gpuivf_gpu.so (the GPU engine, linked with the
 * CUDA runtime and cuBLAS) and calls it through the GpuivfCuda function
 * table; backends and the postmaster never load it.  Engine statuses become
 * SQLSTATEs and errors here.
 */
#include "gpuivf.h"
#include "worker/worker.h"
#include "worker/protocol.h"
#include "worker/bgworker/bgworker.h"

#include <dlfcn.h>
#include <unistd.h>

GpuivfCudaApi GpuivfCuda;
bool        GpuivfCudaBroken = false;

/* ------------------------------------------------------------- engine */

/* The SQLSTATE of a failed engine call; a device error also marks the
 * context lost. */
int
GpuivfCudaErrcode(const gpuivf_cuda_status &st)
{
    int         code;

    switch (st.code)
    {
        case GPUIVF_CUDA_OUT_OF_MEMORY:
            code = ERRCODE_OUT_OF_MEMORY;
            break;
        case GPUIVF_CUDA_CANCELED:
            code = ERRCODE_QUERY_CANCELED;
            break;
        case GPUIVF_CUDA_DEVICE_ERROR:
        case GPUIVF_CUDA_NO_DEVICE:
            GpuivfCudaBroken = true;
            code = ERRCODE_SYSTEM_ERROR;
            break;
        default:
            code = ERRCODE_INTERNAL_ERROR;
            break;
    }
    return code;
}

/* Raise a failed engine call; a device error also marks the context lost. */
void
GpuivfCheckCuda(const gpuivf_cuda_status &st, const char *what)
{
    int         code;

    if (st.code == GPUIVF_CUDA_OK)
        return;
    code = GpuivfCudaErrcode(st);
    ereport(ERROR,
            (errcode(code),
             errmsg("gpuivf GPU engine failed to %s: %s", what, st.message)));
}

/* dlopen the engine and resolve its functions; false with *why on failure. */
bool
LoadEngine(char *why, Size whylen)
{
    char        path[MAXPGPATH];
    void       *handle;

    if (gpuivf_engine_library != NULL && gpuivf_engine_library[0] != '\0')
        strlcpy(path, gpuivf_engine_library, sizeof(path));
    else
        snprintf(path, sizeof(path), "%s/gpuivf_gpu%s", pkglib_path, DLSUFFIX);
    if (access(path, F_OK) != 0)
    {
        snprintf(why, whylen, "gpuivf was built without CUDA (%s does not exist)", path);
        return false;
    }
    handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
    {
        const char *err = dlerror();

        snprintf(why, whylen, "cannot load the GPU engine: %s", err ? err : path);
        return false;
    }
#define GPUIVF_RESOLVE(name) \
    do { \
        void *fn = dlsym(handle, #name); \
        if (fn == NULL) { \
            snprintf(why, whylen, "the GPU engine %s has no function %s", path, #name); \
            return false; \
        } \
        GpuivfCuda.name = (decltype(GpuivfCuda.name)) fn; \
    } while (0);
    GPUIVF_CUDA_FUNCTIONS(GPUIVF_RESOLVE)
#undef GPUIVF_RESOLVE
    return true;
}
