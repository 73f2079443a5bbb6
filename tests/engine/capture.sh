#!/usr/bin/env bash
# Captures what the real llama-server sends, as received by `curl -N -s` straight from the
# engine (no proxy), into tests/fixtures/engine_streams/ (one raw stream or body per endpoint
# tests/engine.rs exercises, plus its response head) and tests/fixtures/engine_metrics/
# (llama-server's /metrics text after those requests). Needs tests/engine/setup.sh first.
#
#   bash tests/engine/capture.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

eval "$(bash tests/engine/setup.sh 2>/dev/null | sed 's/^/export /')"
streams=tests/fixtures/engine_streams
metrics=tests/fixtures/engine_metrics
mkdir -p "$streams" "$metrics"

log=$(mktemp)
"$TOKENMETER_LLAMA_SERVER" --model "$TOKENMETER_LLAMA_MODEL" --alias tiny --host 127.0.0.1 \
  --port 0 --metrics --parallel 2 --ctx-size 2048 --threads 1 >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
# --port 0: the server binds a free port itself and prints it once the model is loaded.
for _ in $(seq 600); do
  grep -q "listening on http://" "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log" >&2; exit 1; }
  sleep 0.1
done
addr=$(grep -o "listening on http://[0-9.:]*" "$log" | head -1 | sed 's|.*http://||')
[ -n "$addr" ] || { cat "$log" >&2; exit 1; }

capture() { # name path body
  curl -N -s -S -D "$streams/$1.head" -o "$streams/$1" -H 'Content-Type: application/json' \
    --data-binary "$3" "http://$addr$2"
  sed -i 's/\r$//' "$streams/$1.head"
  echo "capture.sh: $streams/$1 ($(wc -c <"$streams/$1") bytes)" >&2
}

chat='"model":"tiny","messages":[{"role":"user","content":"Tell me a story about a lighthouse."}],"max_tokens":16,"seed":42'
capture llamacpp_chat_stream_usage.sse /v1/chat/completions \
  "{$chat,\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
capture llamacpp_chat_stream.sse /v1/chat/completions "{$chat,\"stream\":true}"
capture llamacpp_chat.json /v1/chat/completions "{$chat}"
capture llamacpp_completions_stream_usage.sse /v1/completions \
  '{"model":"tiny","prompt":"Once upon a time","max_tokens":16,"seed":42,"stream":true,"stream_options":{"include_usage":true}}'
capture llamacpp_completions_stream.sse /v1/completions \
  '{"model":"tiny","prompt":"Once upon a time","max_tokens":16,"seed":42,"stream":true}'
capture llamacpp_native_completion_stream.sse /completion \
  '{"prompt":"Once upon a time","n_predict":16,"seed":42,"stream":true}'

curl -s -S -o "$metrics/llamacpp.txt" "http://$addr/metrics"
echo "capture.sh: $metrics/llamacpp.txt" >&2
