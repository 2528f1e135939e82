# gpuivf — PGXS build.
#
# The PostgreSQL-facing code (src/pg, C++17 without exceptions) is built by
# PGXS; the engine parts that include no PostgreSQL header (src/core, and
# cuda/ when nvcc is present) are built by CMake into static PIC libraries
# under build/ and linked into gpuivf.so.

# gpuivf_vector holds the operator classes for pgvector's vector and halfvec
# (its control file requires gpuivf and vector); its functions are in
# gpuivf.so, which does not link pgvector.
EXTENSION   = gpuivf gpuivf_vector
EXTVERSION  = 0.1.0
MODULE_big  = gpuivf
DATA        = sql/gpuivf--$(EXTVERSION).sql sql/gpuivf_vector--$(EXTVERSION).sql
PGFILEDESC  = "gpuivf - IVF-PQ vector index with a GPU engine"

# src/pg and its module folders (src/pg/gpuivf.h is the map)
PG_SOURCES = $(sort $(wildcard src/pg/*.cpp src/pg/*/*.cpp src/pg/*/*/*.cpp))
PG_HEADERS = $(sort $(wildcard src/pg/*.h src/pg/*/*.h src/pg/*/*/*.h))
OBJS = $(patsubst %.cpp,%.o,$(PG_SOURCES))

# pg_regress: sql/<name>.sql against expected/<name>.out, in name order.
# Every test starts with CREATE EXTENSION IF NOT EXISTS, so a test runs alone
# and REGRESS_OPTS can be given on the command line, e.g.
#   make installcheck REGRESS_OPTS="--host=/tmp --port=5492 --user=postgres"
#   make installcheck REGRESS="exact vacuum"
REGRESS      = $(sort $(filter-out gpuivf--% gpuivf_vector--%,$(basename $(notdir $(wildcard sql/*.sql)))))

# TAP tests (PostgreSQL::Test::Cluster) under test/t; they need a writable
# source tree (tmp_check/) and a non-root user (initdb refuses root):
#   make installcheck REGRESS= PROVE_TESTS=test/t/001_wal.pl
#   make installcheck-tap [PROVE_TESTS=...]
ifneq ($(wildcard test/t/*.pl),)
TAP_TESTS   = 1
PROVE_TESTS ?= $(sort $(wildcard test/t/*.pl))
endif

BUILD_DIR  ?= build
CMAKE      ?= cmake
CORE_LIB    = $(BUILD_DIR)/libgpuivf_core.a

PG_CPPFLAGS = -I$(srcdir)/src/pg -I$(srcdir)/src/core
PG_CXXFLAGS = -std=c++17 -fno-exceptions -fno-rtti -Wno-missing-field-initializers -Wno-register
# Single-threaded OpenBLAS when Debian's serial flavour is installed (see
# src/core/CMakeLists.txt for why), found at run time through the rpath.
OPENBLAS_SERIAL_DIR = /usr/lib/x86_64-linux-gnu/openblas-serial
ifneq ($(wildcard $(OPENBLAS_SERIAL_DIR)/libopenblas.so),)
SHLIB_LINK += $(CORE_LIB) -L$(OPENBLAS_SERIAL_DIR) -Wl,-rpath,$(OPENBLAS_SERIAL_DIR) -lopenblas -lstdc++ -lm
else
SHLIB_LINK += $(CORE_LIB) -lopenblas -lstdc++ -lm
endif

# Debian's PostgreSQL is built with LLVM JIT; bitcode for a C++ extension
# would need clang, which a fresh machine lacks and the JIT would not use.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# after PGXS, which resets PROVE_FLAGS; override keeps it with PROVE_FLAGS=...
# given on the command line (e.g. --verbose)
override PROVE_FLAGS += -I ./test/perl

# The engine libraries are rebuilt by CMake whenever make runs (CMake itself
# decides what is out of date).
.PHONY: engine
engine:
	$(CMAKE) -S $(srcdir) -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null
	$(CMAKE) --build $(BUILD_DIR) --target gpuivf_core $(if $(findstring -j,$(MAKEFLAGS)),,-j2)

$(CORE_LIB): engine
$(shlib): $(CORE_LIB)
$(OBJS): | engine
# PGXS tracks no header dependencies without --enable-depend: every object
# depends on every header of src/pg (a few dozen; a header change rebuilds
# all of src/pg, which takes well under a minute), the engine's header, and
# the GPU engine's plain C header (types and limits only: gpuivf.so does not
# link the engine)
$(OBJS): $(PG_HEADERS) $(srcdir)/src/core/gpuivf_core.h $(srcdir)/cuda/include/gpuivf_cuda.h

# PostgreSQL's headers have no extern "C" guards; src/pg/gpuivf.h includes
# them inside one extern "C" block.  A PostgreSQL header included anywhere
# else declares PostgreSQL functions with C++ linkage, and gpuivf.so would
# then fail to load ("undefined symbol: _Z...").  Catch that at build time:
# the only mangled names gpuivf.so may import are versioned libstdc++ ones.
all: check-c-linkage
.PHONY: check-c-linkage
check-c-linkage: $(shlib)
	@bad=$$(nm -D --undefined-only $(shlib) | awk '$$2 ~ /^_Z/ && $$2 !~ /@/ {print $$2}'); \
	if [ -n "$$bad" ]; then \
	  echo "$(shlib) imports PostgreSQL functions with C++ linkage; include every PostgreSQL header through src/pg/gpuivf.h:"; \
	  echo "$$bad" | c++filt | head -20; \
	  rm -f $(shlib); exit 1; \
	fi

# Only the TAP tests (pg_regress needs a running server, TAP tests start
# their own clusters).
.PHONY: installcheck-tap
installcheck-tap:
ifdef TAP_TESTS
	$(prove_installcheck)
else
	@echo "no TAP tests under test/t"
endif

clean: clean-engine
.PHONY: clean-engine
clean-engine:
	rm -rf $(BUILD_DIR)

# ------------------------------------------------------------ GPU engine
# When CMake found nvcc it has a target gpuivf_cuda (build/libgpuivf_cuda.a).
# That library, the static CUDA runtime and cuBLAS are linked into a module of
# their own, gpuivf_gpu.so, which only the GPU worker dlopen()s.  gpuivf.so
# never depends on CUDA: it loads where there is no NVIDIA driver and no CUDA
# library (CI), and the postmaster and backends never map CUDA.  Without nvcc
# (or with WITH_CUDA=no) there is no gpuivf_gpu.so and the worker reports
# "built without CUDA"; scans run on the CPU.  A cuda/ that fails to compile
# is reported loudly but does not stop the build of gpuivf.so for users (its
# own tests, ctest, fail instead) — except in strict mode: with CI=true (CI
# sets it) or GPUIVF_STRICT_CUDA=1 a cuda/ compile failure fails the build,
# so that a broken GPU engine cannot pass CI as a CPU-only build.
# GPUIVF_STRICT_CUDA=0 turns strict mode off even under CI.
WITH_CUDA  ?= auto
ifeq ($(GPUIVF_STRICT_CUDA),)
GPUIVF_STRICT_CUDA := $(if $(filter true 1 yes,$(CI)),1,0)
endif
CUDA_HOME  ?= /usr/local/cuda
CUDA_LIB    = $(BUILD_DIR)/libgpuivf_cuda.a
GPU_MODULE  = gpuivf_gpu$(DLSUFFIX)
# DT_RPATH (not RUNPATH) so that libcublas finds libcublasLt there too
GPU_LINK    = -Wl,--whole-archive $(CUDA_LIB) -Wl,--no-whole-archive \
              -L$(CUDA_HOME)/lib64 -Wl,--disable-new-dtags,-rpath,$(CUDA_HOME)/lib64 \
              -lcudart_static -lcublas -Wl,--exclude-libs,libcudart_static.a \
              -ldl -lpthread -lrt -lstdc++ -lm -Wl,--no-undefined

all: gpu-module
.PHONY: gpu-module install-gpu-module uninstall-gpu-module
gpu-module: engine
ifneq ($(WITH_CUDA),no)
	@if $(CMAKE) --build $(BUILD_DIR) --target help 2>/dev/null | grep -q ' gpuivf_cuda$$'; then \
	  if $(CMAKE) --build $(BUILD_DIR) --target gpuivf_cuda $(if $(findstring -j,$(MAKEFLAGS)),,-j2); then \
	    if [ ! -f $(GPU_MODULE) ] || [ $(CUDA_LIB) -nt $(GPU_MODULE) ]; then \
	      echo "gpuivf: linking $(GPU_MODULE) (the GPU engine the GPU worker loads)"; \
	      $(CXX) -shared -o $(GPU_MODULE) $(GPU_LINK) || exit 1; \
	    fi; \
	  else \
	    rm -f $(GPU_MODULE); \
	    if [ "$(GPUIVF_STRICT_CUDA)" = 1 ]; then \
	      echo "gpuivf: ERROR: the GPU engine (cuda/) failed to build, see above" \
	           "(strict: CI=$(CI), GPUIVF_STRICT_CUDA=$(GPUIVF_STRICT_CUDA))" >&2; \
	      exit 1; \
	    fi; \
	    echo "gpuivf: WARNING: the GPU engine (cuda/) failed to build, see above;" \
	         "gpuivf.so is built without it and scans run on the CPU" \
	         "(CI=true or GPUIVF_STRICT_CUDA=1 makes this an error)" >&2; \
	  fi; \
	else \
	  rm -f $(GPU_MODULE); \
	  echo "gpuivf: built without CUDA (nvcc not found): no GPU engine, scans run on the CPU"; \
	fi
else
	@rm -f $(GPU_MODULE); echo "gpuivf: WITH_CUDA=no: built without the GPU engine"
endif

install: install-gpu-module
install-gpu-module: gpu-module installdirs
	@if [ -f $(GPU_MODULE) ]; then \
	  echo "$(INSTALL_SHLIB) $(GPU_MODULE) '$(DESTDIR)$(pkglibdir)/'"; \
	  $(INSTALL_SHLIB) $(GPU_MODULE) '$(DESTDIR)$(pkglibdir)/'; \
	else rm -f '$(DESTDIR)$(pkglibdir)/$(GPU_MODULE)'; fi

uninstall: uninstall-gpu-module
uninstall-gpu-module:
	rm -f '$(DESTDIR)$(pkglibdir)/$(GPU_MODULE)'

# A CPU stand-in for gpuivf_gpu.so (test/gpu/fake_engine.cpp, src/core
# inside), so the worker protocol is tested where there is no GPU: the TAP
# test sets gpuivf.engine_library to it.
FAKE_GPU_ENGINE = $(BUILD_DIR)/gpuivf_fake_gpu$(DLSUFFIX)
all: fake-gpu-engine
.PHONY: fake-gpu-engine
fake-gpu-engine: $(FAKE_GPU_ENGINE)
$(FAKE_GPU_ENGINE): $(srcdir)/test/gpu/fake_engine.cpp $(CORE_LIB) $(srcdir)/cuda/include/gpuivf_cuda.h | engine
	$(CXX) -std=c++17 -O2 -fPIC -shared -I$(srcdir)/src/core -I$(srcdir)/cuda/include \
	  -o $@ $< $(CORE_LIB) $(filter -L% -Wl% -lopenblas,$(SHLIB_LINK)) -lopenblas -lstdc++ -lm

clean: clean-gpu-module
.PHONY: clean-gpu-module
clean-gpu-module:
	rm -f $(GPU_MODULE)
