#!/usr/bin/env bash
# llama.cpp's command-line tools, the CPU peer the benchmarks compare with, built from the llama.cpp source that the
# llama-cpp-python 0.3.36 source package on PyPI carries (a registry this machine reaches; GitHub is not needed).
# For benchmarking only: nothing of it goes into augur.
#
# Usage: bash tools/bench/build-llama-cpp.sh [OUT_DIR]   (default target/llama-cpp; tools land in OUT_DIR/bin)
# Needs: python3 with pip, cmake, a C++ compiler. About 15 minutes on 2 cores.
set -euo pipefail
OUT=${1:-target/llama-cpp}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
VERSION=0.3.36
if [ ! -d "$OUT/src" ]; then
  python3 -m pip download --no-deps --no-binary llama-cpp-python --disable-pip-version-check "llama-cpp-python==$VERSION" -d "$OUT/sdist"
  tar xzf "$OUT/sdist/llama_cpp_python-$VERSION.tar.gz" -C "$OUT/sdist"
  mv "$OUT/sdist/llama_cpp_python-$VERSION/vendor/llama.cpp" "$OUT/src"
  rm -rf "$OUT/sdist"
fi
# The x86 extensions are named one by one instead of -march=native, each on only where /proc/cpuinfo lists it:
# one build machine advertised AMX, whose use the kernel refused (an illegal instruction at run time), so AMX stays
# off; another (AMD EPYC) has AVX-512 VNNI but not the VEX-encoded AVX-VNNI.
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null && echo ON || echo OFF; }
cmake -S "$OUT/src" -B "$OUT/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" \
  -DGGML_BMI2="$(has bmi2)" -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512f)" \
  -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
  -DGGML_AVX512_BF16="$(has avx512_bf16)" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF
cmake --build "$OUT/build" -j"$(nproc)" --target llama-bench llama-speculative-simple llama-speculative \
  llama-lookup llama-completion llama-server
mkdir -p "$OUT/bin"
cp -a "$OUT"/build/bin/* "$OUT/bin/"
echo "llama.cpp tools in $OUT/bin"
