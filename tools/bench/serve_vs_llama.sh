#!/bin/bash
# Serving load runs, `augur serve` against `llama-server`, on the same GGUF files, 2 threads, loopback.
# Usage: tools/bench/serve_vs_llama.sh LLAMA_BIN_DIR [MODELS_DIR] > results.jsonl
# Each line: {"run", "clients", "result"} with serve_load.py's throughput and p50/p99 latency.
set -u
LLAMA=${1:?llama.cpp bin directory}
M=${2:-$HOME/.cache/augur/models}
A=target/release/augur
Q05=$M/qwen2.5-coder-0.5b-instruct.gguf
Q15=$M/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

wait_up() { for _ in $(seq 1 120); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
load() { # NAME URL CLIENTS [SPECULATION-JSON]
  local r
  r=$(python3 tools/bench/serve_load.py --url "$2" --clients "$3" --requests 2 --max-tokens 64 --chat ${4:+--speculation "$4"})
  echo "{\"run\": \"$1\", \"clients\": $3, \"result\": $r}"
}
augur() { # NAME MODEL "EXTRA ARGS" SPECULATION CLIENTS...
  local name=$1 model=$2 extra=$3 spec=$4; shift 4
  $A serve --model "$model" --port 8091 --threads 2 --parallel 8 --queue 32 $extra >/dev/null 2>&1 &
  local pid=$!
  wait_up http://127.0.0.1:8091 || { echo "augur serve did not start" >&2; kill $pid; return; }
  for c in "$@"; do load "$name" http://127.0.0.1:8091 "$c" "$spec"; done
  kill $pid; wait $pid 2>/dev/null
}
llama() { # NAME MODEL "EXTRA ARGS" CLIENTS...
  local name=$1 model=$2 extra=$3; shift 3
  "$LLAMA/llama-server" -m "$model" --port 8092 -t 2 -np 8 -c 8192 $extra >/dev/null 2>&1 &
  local pid=$!
  wait_up http://127.0.0.1:8092 || { echo "llama-server did not start" >&2; kill $pid; return; }
  for c in "$@"; do load "$name" http://127.0.0.1:8092 "$c"; done
  kill $pid; wait $pid 2>/dev/null
}

augur augur-plain "$Q05" "" '"off"' 4 8
augur augur-lookup "$Q05" "" '{"method": "prompt_lookup", "prompt_lookup_num_tokens": 10}' 4 8
llama llama-plain "$Q05" "" 4 8
llama llama-ngram "$Q05" "--spec-type ngram-simple" 4 8
augur augur-1.5b-plain "$Q15" "--assistant-model $Q05" '"off"' 4
augur augur-1.5b-assistant "$Q15" "--assistant-model $Q05" '{"method": "assistant_model"}' 4
llama llama-1.5b-plain "$Q15" "" 4
llama llama-1.5b-draft "$Q15" "-md $Q05 --spec-draft-n-max 4" 4
