#!/bin/bash
# cuda/bench/make_device_kit.sh [BASE] — here, not on the GPU machine: packs
# what that machine lacks for building and testing the GPU engine into
# .device/cuda/kit.tar.xz (git ignores .device/): OpenBLAS with its Fortran
# runtime and cblas.h (the CPU engine, the tests' reference), GoogleTest, and
# siftsmall from ${GPUIVF_DATA_DIR:-../shared/data}.  With BASE (a commit),
# also extracts that commit's tree into .device/cuda/old, the baseline of
# compare_engines.sh.  Then carry .device/cuda in the device call.
set -eu
cd "$(git rev-parse --show-toplevel)"
K=.device/cuda
mkdir -p $K
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/include" "$stage/data"

lib() { # the file a library name resolves to here
	ldconfig -p | awk -v n="$1" '$1 == n && /x86-64/ {print $NF; exit}'
}
blas=/usr/lib/x86_64-linux-gnu/openblas-serial/libopenblas.so.0
[ -f $blas ] || blas=$(lib libopenblas.so.0)
cp -L "$blas" "$stage/lib/libopenblas.so.0"
ln -s libopenblas.so.0 "$stage/lib/libopenblas.so"
for so in libgfortran.so.5 libquadmath.so.0; do cp -L "$(lib $so)" "$stage/lib/$so"; done
inc=/usr/include/x86_64-linux-gnu/openblas-serial
[ -f $inc/cblas.h ] || inc=/usr/include/x86_64-linux-gnu
cp -L $inc/cblas.h $inc/openblas_config.h "$stage/include/"
cp -L /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a "$stage/lib/"
cp -rL /usr/include/gtest "$stage/include/"
data=${GPUIVF_DATA_DIR:-../shared/data}
if [ -d "$data/siftsmall" ]; then cp -rL "$data/siftsmall" "$stage/data/"; else echo "no siftsmall in $data: its tests will skip"; fi
tar -cJf $K/kit.tar.xz -C "$stage" .
ls -l $K/kit.tar.xz

if [ $# -ge 1 ]; then
	rm -rf $K/old && mkdir -p $K/old
	git archive "$1" | tar -x -C $K/old
	echo "$1 -> $K/old"
fi
