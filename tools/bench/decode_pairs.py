#!/usr/bin/env python3
"""augur and llama.cpp in back-to-back pairs: `augur bench` then `llama-bench`, REPS times per model, each run one
repetition. On a machine whose speed drifts (shared hosts, steal time) the ratio within each pair is steadier than
a ratio of medians taken minutes apart; both are printed, with every pair's figures.

    python3 tools/bench/decode_pairs.py --llama-bin target/llama-cpp/bin --reps 5 --pp 0 --tg 64 M.gguf...

Prints one JSON line per pair and one Markdown row per model. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+", help="GGUF files")
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--augur", default="target/release/augur")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pp", type=int, default=0, help="prompt tokens of the prefill measurement (0: none)")
    ap.add_argument("--tg", type=int, default=64, help="tokens of the decode measurement")
    args = ap.parse_args()
    for model in args.models:
        pairs = []
        for _ in range(args.reps):
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                subprocess.run([args.augur, "bench", "--model", model, "--threads", str(args.threads), "-p",
                                str(args.pp), "-n", str(args.tg), "--k", "1", "--reps", "1", "--json", f.name],
                               capture_output=True, check=True)
                a = json.load(open(f.name))
            out = subprocess.run([os.path.join(args.llama_bin, "llama-bench"), "-m", model, "-t", str(args.threads),
                                  "-p", str(args.pp), "-n", str(args.tg), "-r", "1", "-o", "json"],
                                 capture_output=True, text=True, check=True).stdout
            llama = {}
            for e in json.loads(out):
                if e["n_gen"] > 0:
                    llama["decode"] = e["avg_ts"]
                elif e["n_prompt"] > 0:
                    llama["prefill"] = e["avg_ts"]
            pair = {"augur_decode": a["decode_tokens_per_s"], "llama_decode": llama.get("decode"),
                    "augur_prefill": a.get("prefill_tokens_per_s"), "llama_prefill": llama.get("prefill"),
                    "read_gb_per_s": a["read_bytes_per_s"] / 1e9, "share_of_bound": a["decode_share_of_bound"]}
            pairs.append(pair)
            print(json.dumps({"model": os.path.basename(model), **pair}), flush=True)
        med = lambda k: statistics.median(p[k] for p in pairs)  # noqa: E731
        ratio = statistics.median(p["augur_decode"] / p["llama_decode"] for p in pairs)
        row = (f"| {os.path.basename(model)} | {med('augur_decode'):.1f} | {med('llama_decode'):.1f} | {ratio:.2f}x "
               f"| {100 * med('share_of_bound'):.0f}% | {med('read_gb_per_s'):.1f} GB/s |")
        if args.pp:
            pre = statistics.median(p["augur_prefill"] / p["llama_prefill"] for p in pairs)
            row += f" {med('augur_prefill'):.1f} | {med('llama_prefill'):.1f} | {pre:.2f}x |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
