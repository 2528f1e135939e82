// The GPU tests' main: one resources object for the whole binary, created
// only when a CUDA device exists (every test then skips visibly otherwise).
#include <cstdio>

#include "cuda_test_util.h"

namespace gt {

namespace {
gpuivf_cuda_resources *g_res = nullptr;
bool g_checked = false;
} // namespace

gpuivf_cuda_resources *gpu() {
    if (!g_checked) {
        g_checked = true;
        int32_t count = 0;
        gpuivf_cuda_status st = gpuivf_cuda_device_count(&count);
        if (st.code == GPUIVF_CUDA_OK && count > 0) {
            st = gpuivf_cuda_resources_create(0, int64_t(1) << 30, &g_res);
            if (st.code != GPUIVF_CUDA_OK) {
                std::fprintf(stderr, "cannot create GPU resources: %s\n", st.message);
                g_res = nullptr;
            }
        }
    }
    return g_res;
}

class GpuEnvironment : public ::testing::Environment {
public:
    void SetUp() override {
        if (gpu() == nullptr) {
            std::printf("skipped: no CUDA device (every GPU test of this binary is skipped)\n");
        } else {
            gpuivf_cuda_device_info info;
            if (gpuivf_cuda_get_device_info(gpu(), &info).code == GPUIVF_CUDA_OK)
                std::printf("GPU: %s, %d multiprocessors, compute %d.%d\n", info.name, info.multiprocessors,
                            info.compute_major, info.compute_minor);
        }
    }
    void TearDown() override {
        if (g_res) gpuivf_cuda_resources_destroy(g_res);
        g_res = nullptr;
    }
};

} // namespace gt

int main(int argc, char **argv) {
    ::testing::InitGoogleTest(&argc, argv);
    ::testing::AddGlobalTestEnvironment(new gt::GpuEnvironment);
    return RUN_ALL_TESTS();
}
