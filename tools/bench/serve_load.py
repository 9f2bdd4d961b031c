#!/usr/bin/env python3
"""A bounded load run against an OpenAI-compatible server (`augur serve`, `llama-server`, ...).

N concurrent clients each send R completion requests (prompts from a file, one per line, or a built-in set),
greedy, with `ignore_eos` so every request generates exactly --max-tokens tokens. Reports aggregate throughput
and p50/p99 request latency as one JSON line; with --stream the answers are streamed and the time to the first
text (p50/p99) is reported too, and each request's decode rate after its first text (tokens after the first over
the seconds from the first text to the last: the server's per-token cost, prefill apart; median over requests), beside the server's own decode rate where it
reports llama-server's `timings`. Standard library only.

    python3 tools/bench/serve_load.py --url http://127.0.0.1:8080 --clients 4 --requests 8 --max-tokens 128 \
        [--speculation '{"method": "prompt_lookup", "prompt_lookup_num_tokens": 10}'] [--prompts FILE] [--chat] \
        [--stream]
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request

DEFAULT_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring and tests.",
    "Explain how a hash map works, with an example in Rust.",
    "Summarize the plot of Romeo and Juliet in five sentences.",
    "List ten uses of a paperclip, one per line, each with a short explanation.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--speculation", default=None, help="JSON for augur's `speculation` field")
    ap.add_argument("--stream", action="store_true", help="stream the answers and time the first text")
    args = ap.parse_args()
    prompts = DEFAULT_PROMPTS
    if args.prompts:
        with open(args.prompts) as f:
            prompts = [l.rstrip("\n") for l in f if l.strip()]
    path = "/v1/chat/completions" if args.chat else "/v1/completions"
    latencies, first_text, tokens, errors, decode_rates, engine_rates = [], [], [], [], [], []
    lock = threading.Lock()

    def client(c):
        for r in range(args.requests):
            prompt = prompts[(c * args.requests + r) % len(prompts)]
            body = {"max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True}
            if args.model:
                body["model"] = args.model
            if args.chat:
                body["messages"] = [{"role": "user", "content": prompt}]
            else:
                body["prompt"] = prompt
            if args.speculation:
                body["speculation"] = json.loads(args.speculation)
            if args.stream:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            req = urllib.request.Request(
                args.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
            )
            t0 = time.perf_counter()
            try:
                first, last, used, timings = None, None, None, None
                with urllib.request.urlopen(req, timeout=600) as resp:
                    if args.stream:
                        for line in resp:
                            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                                continue
                            event = json.loads(line[6:])
                            choice = (event.get("choices") or [{}])[0]
                            text = choice.get("text") or (choice.get("delta") or {}).get("content")
                            if text:
                                last = time.perf_counter() - t0
                                if first is None:
                                    first = last
                            if event.get("usage"):
                                used = event["usage"]["completion_tokens"]
                            if event.get("timings"):
                                timings = event["timings"]
                    else:
                        whole = json.loads(resp.read())
                        used, timings = whole["usage"]["completion_tokens"], whole.get("timings")
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    tokens.append(used or 0)
                    if first is not None:
                        first_text.append(first)
                        if used and used > 1 and last > first:
                            decode_rates.append((used - 1) / (last - first))
                    if timings and timings.get("predicted_per_second"):
                        engine_rates.append(timings["predicted_per_second"])
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(str(e))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    lat, ttft = sorted(latencies), sorted(first_text)
    pick = lambda q, xs=lat: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None  # noqa: E731
    print(
        json.dumps(
            {
                "clients": args.clients,
                "requests": len(lat),
                "errors": len(errors),
                "completion_tokens": sum(tokens),
                "wall_seconds": round(wall, 3),
                "tokens_per_second": round(sum(tokens) / wall, 2) if wall > 0 else None,
                "latency_p50_s": pick(0.5),
                "latency_p99_s": pick(0.99),
                "latency_mean_s": statistics.mean(lat) if lat else None,
                "ttft_p50_s": pick(0.5, ttft),
                "ttft_p99_s": pick(0.99, ttft),
                "decode_tokens_per_second_p50": round(statistics.median(decode_rates), 2) if decode_rates else None,
                # The server's own decode rate (llama-server's `timings.predicted_per_second`, which augur gives
                # too): against the one above, what the HTTP side costs per token.
                "engine_decode_tokens_per_second_p50": (
                    round(statistics.median(engine_rates), 2) if engine_rates else None
                ),
                "speculation": json.loads(args.speculation) if args.speculation else None,
            }
        )
    )
    if errors:
        print("first error:", errors[0])


if __name__ == "__main__":
    main()
