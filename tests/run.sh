#!/usr/bin/env bash
# The test command: on a fresh Debian machine with only the Rust toolchain, installs what the
# tests use (promtool from Debian's prometheus package, curl, chromium for the live view's
# browser test, the openai Python package, kubernetes-validate and prometheus-operator's models),
# then runs formatting, lints and every test, and replays docker/Dockerfile (docker/check.sh).
# CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
# The binary's allocator (jemalloc) is built from C with make.
command -v make >/dev/null 2>&1 || missing+=(make)
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "tests/run.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! python3 -c "import openai" 2>/dev/null; then
  echo "tests/run.sh: installing the openai Python package"
  python3 -m pip install -q openai 2>/dev/null \
    || python3 -m pip install -q --break-system-packages openai
fi
# tests/k8s.rs: kubernetes-validate for built-in kinds, prometheus-operator's models for its CRDs.
# Pinned: what they accept is the test's expectation (schemas for Kubernetes 1.30 to 1.37).
validators=(kubernetes-validate==1.37.0 cloudcoil-models-prometheus-operator==0.80.1.0)
if ! command -v kubernetes-validate >/dev/null 2>&1 \
  || ! python3 -c "import cloudcoil.models.prometheus_operator" 2>/dev/null; then
  echo "tests/run.sh: installing kubernetes-validate and cloudcoil-models-prometheus-operator"
  python3 -m pip install -q "${validators[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${validators[@]}"
fi
# tests/engine.rs: llama.cpp's llama-server and a tiny model, built once into a cache directory
# outside the repository (about 6 minutes on 2 cores the first time, then nothing to do).
engine_env=$(bash tests/engine/setup.sh)
export TOKENMETER_LLAMA_SERVER="$(sed -n 's/^TOKENMETER_LLAMA_SERVER=//p' <<<"$engine_env")"
export TOKENMETER_LLAMA_MODEL="$(sed -n 's/^TOKENMETER_LLAMA_MODEL=//p' <<<"$engine_env")"
export TOKENMETER_LLAMA_SLOW_MODEL="$(sed -n 's/^TOKENMETER_LLAMA_SLOW_MODEL=//p' <<<"$engine_env")"

# One build, no incremental state: it would only add a gigabyte to a fresh machine's disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
cargo fmt --check
cargo clippy --all-targets -- -D warnings
cargo test
# No Docker engine in CI: replay docker/Dockerfile's build and check the result (docker/check.sh).
bash docker/check.sh
