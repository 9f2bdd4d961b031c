#!/bin/bash
# Serving load runs, `augur serve` against `llama-server`, on the same GGUF file, 2 threads each, loopback.
# Usage: [MODEL=FILE.gguf] [CLIENTS="1 8"] tools/bench/serve_vs_llama.sh LLAMA_BIN_DIR [MODELS_DIR] > results.jsonl
# The three servers (augur, whose speculation is per request; llama-server plain; llama-server with n-gram
# speculation) stay up together, idle but for the run in progress, and the runs alternate between them at each
# client count (1, 4, 8, 16), so that a drift in the machine's speed touches all of them alike. augur runs plain
# (`"speculation": "off"`), with prompt lookup, and as a user gets it without the field (`auto`, its default).
# MODEL defaults to the Qwen2.5-Coder-0.5B file.
# Each line: {"run", "clients", "result"} with serve_load.py's throughput, p50/p99 latency and time to first text.
set -u
LLAMA=${1:?llama.cpp bin directory}
M=${2:-$HOME/.cache/augur/models}
A=target/release/augur
GGUF=${MODEL:-$M/qwen2.5-coder-0.5b-instruct.gguf}
CLIENTS=${CLIENTS:-1 4 8 16}

wait_up() { for _ in $(seq 1 120); do curl -sf "$1/health" >/dev/null 2>&1 && return 0; sleep 1; done; return 1; }
load() { # NAME URL CLIENTS [SPECULATION-JSON]
  local r
  r=$(python3 tools/bench/serve_load.py --url "$2" --clients "$3" --requests 2 --max-tokens 64 --chat --stream \
    ${4:+--speculation "$4"})
  echo "{\"run\": \"$1\", \"clients\": $3, \"result\": $r}"
}
$A serve --model "$GGUF" --port 8091 --threads 2 --parallel 16 --queue 64 >/dev/null 2>&1 &
AUGUR=$!
"$LLAMA/llama-server" -m "$GGUF" --port 8092 -t 2 -np 16 -c 16384 >/dev/null 2>&1 &
PLAIN=$!
"$LLAMA/llama-server" -m "$GGUF" --port 8093 -t 2 -np 16 -c 16384 --spec-type ngram-simple >/dev/null 2>&1 &
NGRAM=$!
trap 'kill $AUGUR $PLAIN $NGRAM 2>/dev/null; wait 2>/dev/null' EXIT
for url in http://127.0.0.1:8091 http://127.0.0.1:8092 http://127.0.0.1:8093; do
  wait_up $url || { echo "$url did not start" >&2; exit 1; }
done
for c in $CLIENTS; do
  load augur-plain http://127.0.0.1:8091 "$c" '"off"'
  load llama-plain http://127.0.0.1:8092 "$c"
  load augur-lookup http://127.0.0.1:8091 "$c" '{"method": "prompt_lookup", "prompt_lookup_num_tokens": 10}'
  load llama-ngram http://127.0.0.1:8093 "$c"
  load augur-auto http://127.0.0.1:8091 "$c"
done
