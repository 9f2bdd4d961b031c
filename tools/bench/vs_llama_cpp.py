#!/usr/bin/env python3
"""augur next to llama.cpp on the same GGUF files and thread count, measured in one run.

  speed:  `augur bench` and `llama-bench` alternated REPS times per model; medians of prefill (pp) and decode
          (tg) tokens per second, and augur's k-token forward cost curve.
  spec:   `augur bench --prompts` (plain and each method, interleaved per prompt) over Spec-Bench prompts, then
          llama.cpp on the very same rendered prompts: llama-completion (plain), llama-speculative-simple with
          the draft model, llama-lookup (n-gram). Speedups are each tool's method over its own plain decoding,
          on total (prefill + decode) seconds, summed over prompts; each (prompt, method) is the median of REPS
          runs, the methods taking turns within each repetition.
  prefill: prefill tokens per second at each of --pp-list: augur with AMX tiles where the CPU grants them,
          augur with `AUGUR_AMX=off` (VNNI only) and llama-bench, the three alternated REPS times; medians.

Usage:
  tools/bench/vs_llama_cpp.py speed --llama-bin DIR --augur target/release/augur --threads 2 --reps 3 M.gguf...
  tools/bench/vs_llama_cpp.py prefill --llama-bin DIR --threads 2 --reps 3 --pp-list 128,512,2048 M.gguf...
  tools/bench/vs_llama_cpp.py spec --llama-bin DIR --augur target/release/augur --threads 2 \
      --model TARGET.gguf [--draft DRAFT.gguf] --prompts question.jsonl --limit 2 --reps 3 [--categories a,b]

Prints Markdown tables for BENCHMARKS.md and writes the raw results as JSON next to --out (default
bench-results.json). Standard library only.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def run(cmd, timeout=3600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
    return p.stdout, p.stderr


def augur_speed(augur, model, threads, pp, tg, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        cmd = [augur, "bench", "--model", model, "--threads", str(threads), "-p", str(pp), "-n", str(tg),
               "--reps", "1", "--k", "1,2,4,8", "--json", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**os.environ, **(env or {})})
        if p.returncode != 0:
            sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-3000:]}")
        return json.load(open(f.name))


def llama_speed(bin_dir, model, threads, pp, tg):
    out, _ = run([os.path.join(bin_dir, "llama-bench"), "-m", model, "-t", str(threads), "-p", str(pp), "-n",
                  str(tg), "-r", "1", "-o", "json"])
    res = {}
    for e in json.loads(out):
        if e["n_prompt"] > 0 and e["n_gen"] == 0:
            res["prefill_tokens_per_s"] = e["avg_ts"]
        if e["n_gen"] > 0 and e["n_prompt"] == 0:
            res["decode_tokens_per_s"] = e["avg_ts"]
    return res


def speed(args):
    rows, raw = [], {}
    for model in args.models:
        ours, theirs = [], []
        for _ in range(args.reps):
            ours.append(augur_speed(args.augur, model, args.threads, args.pp, args.tg))
            theirs.append(llama_speed(args.llama_bin, model, args.threads, args.pp, args.tg))
        med = lambda xs, k: statistics.median(x[k] for x in xs)
        r = {
            "model": os.path.basename(model),
            "augur_pp": med(ours, "prefill_tokens_per_s"),
            "llama_pp": med(theirs, "prefill_tokens_per_s"),
            "augur_tg": med(ours, "decode_tokens_per_s"),
            "llama_tg": med(theirs, "decode_tokens_per_s"),
            "k_cost": {k: statistics.median(o["k_cost"][k]["relative"] for o in ours) for k in ours[0]["k_cost"]},
        }
        rows.append(r)
        raw[model] = {"augur": ours, "llama.cpp": theirs}
    print(f"\n{args.threads} threads, pp{args.pp} / tg{args.tg}, median of {args.reps} alternated runs\n")
    print("| model | prefill augur | prefill llama.cpp | ratio | decode augur | decode llama.cpp | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['augur_pp']:.1f} | {r['llama_pp']:.1f} | {r['augur_pp'] / r['llama_pp']:.2f}x "
              f"| {r['augur_tg']:.1f} | {r['llama_tg']:.1f} | {r['augur_tg'] / r['llama_tg']:.2f}x |")
    print("\nk-token forward cost relative to a one-token forward (augur, context 64)\n")
    ks = list(rows[0]["k_cost"].keys())
    print("| model | " + " | ".join(f"k={k}" for k in ks) + " |")
    print("|---|" + "---:|" * len(ks))
    for r in rows:
        print(f"| {r['model']} | " + " | ".join(f"{r['k_cost'][k]:.2f}x" for k in ks) + " |")
    return {"rows": rows, "raw": raw}


def prefill(args):
    rows = []
    for model in args.models:
        for pp in [int(p) for p in args.pp_list.split(",")]:
            tiles, vnni, theirs = [], [], []
            for _ in range(args.reps):
                tiles.append(augur_speed(args.augur, model, args.threads, pp, 0)["prefill_tokens_per_s"])
                vnni.append(augur_speed(args.augur, model, args.threads, pp, 0, {"AUGUR_AMX": "off"})
                            ["prefill_tokens_per_s"])
                theirs.append(llama_speed(args.llama_bin, model, args.threads, pp, 0)["prefill_tokens_per_s"])
            rows.append({"model": os.path.basename(model), "pp": pp, "tiles": tiles, "vnni": vnni, "llama": theirs})
    print(f"\n{args.threads} threads, prefill tokens/s, median of {args.reps} alternated runs\n")
    print("| model | prompt | augur, AMX | augur, VNNI only | llama.cpp | AMX / llama.cpp | AMX / VNNI |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        t, v, l = (statistics.median(r[k]) for k in ("tiles", "vnni", "llama"))
        print(f"| {r['model']} | {r['pp']} | {t:.1f} | {v:.1f} | {l:.1f} | {t / l:.2f}x | {t / v:.2f}x |")
    return {"rows": rows}


NUM = r"([0-9.]+)"


def parse_timings(text):
    """Total seconds and generated tokens from a llama.cpp tool's log."""
    enc = re.search(rf"encoded\s+(\d+) tokens in\s+{NUM} seconds", text)
    dec = re.search(rf"decoded\s+(\d+) tokens in\s+{NUM} seconds", text)
    if enc and dec:
        res = {"seconds": float(enc.group(2)) + float(dec.group(2)), "new_tokens": int(dec.group(1))}
        for key in ("n_drafted", "n_accept"):
            m = re.search(rf"{key}\s*=\s*(\d+)", text)
            if m:
                res[key] = int(m.group(1))
        return res
    pe = re.search(rf"prompt eval time =\s+{NUM} ms", text)
    ev = re.search(rf"\beval time =\s+{NUM} ms /\s+(\d+) runs", text)
    if pe and ev:
        # The first generated token comes out of the prompt evaluation.
        return {"seconds": (float(pe.group(1)) + float(ev.group(1))) / 1e3, "new_tokens": int(ev.group(2)) + 1}
    sys.exit("cannot parse llama.cpp timings from:\n" + text[-2000:])


def llama_spec_runs(args, prompts, max_new):
    b = lambda name: os.path.join(args.llama_bin, name)
    common = ["-t", str(args.threads), "--temp", "0", "-n", str(max_new), "-c", "4096"]
    tools = {"plain": lambda p: [b("llama-completion"), "-m", args.model, "-p", p, "-no-cnv", "--no-warmup"] + common,
             "lookup": lambda p: [b("llama-lookup"), "-m", args.model, "-p", p, "--spec-draft-n-max", "10"] + common}
    if args.draft:
        tools["draft"] = lambda p: [b("llama-speculative-simple"), "-m", args.model, "-md", args.draft,
                                    "--spec-type", "draft-simple",
                                    "--spec-draft-n-max", str(args.draft_max), "-td", str(args.threads), "-p", p] + common
    runs = []
    for pr in prompts:
        # As augur's side: the tools take turns within each repetition; the median run per (prompt, tool).
        reps = {name: [] for name in tools}
        for _ in range(args.reps):
            for name, cmd in tools.items():
                out, err = run(cmd(pr["text"]))
                t = parse_timings(out + err)
                t.update({"question_id": pr["question_id"], "category": pr["category"], "tool": name})
                print(f"  llama.cpp {name:<7} q{pr['question_id']:<4} {t['new_tokens']:>4} tokens "
                      f"{t['seconds']:7.2f} s", file=sys.stderr)
                reps[name].append(t)
        for rs in reps.values():
            runs.append(sorted(rs, key=lambda t: t["seconds"])[(len(rs) - 1) // 2])
    return runs


def spec(args):
    out_json = args.out + ".augur.json"
    cmd = [args.augur, "bench", "--model", args.model, "--threads", str(args.threads), "--prompts", args.prompts,
           "--limit", str(args.limit), "--max-new-tokens", str(args.max_new_tokens), "--reps", str(args.reps),
           "--json", out_json,
           "--methods", "prompt_lookup" + (",assistant_model" if args.draft else "")]
    if args.draft:
        cmd += ["--assistant-model", args.draft]
    if args.categories:
        cmd += ["--categories", args.categories]
    if args.augur_json:
        # An earlier augur run on the same prompts: only llama.cpp runs now.
        ours = json.load(open(args.augur_json))
        table = "(augur table: see the earlier run)\n"
    else:
        t0 = time.time()
        table, _ = run(cmd)
        ours = json.load(open(out_json))
        print(f"augur: {time.time() - t0:.0f} s", file=sys.stderr)
    theirs = llama_spec_runs(args, ours["prompts"], args.max_new_tokens)

    cats = sorted({r["category"] for r in theirs}) + ["overall"]
    agg = {}
    for r in theirs:
        for c in (r["category"], "overall"):
            a = agg.setdefault((c, r["tool"]), {"tokens": 0, "seconds": 0.0, "drafted": 0, "accepted": 0})
            a["tokens"] += r["new_tokens"]
            a["seconds"] += r["seconds"]
            a["drafted"] += r.get("n_drafted", 0)
            a["accepted"] += r.get("n_accept", 0)
    print("\naugur (Spec-Bench protocol: greedy, batch 1, first turn, chat template)\n")
    print(table)
    print("llama.cpp on the same rendered prompts (each method over llama.cpp's own plain decoding)\n")
    tools = ["plain", "lookup"] + (["draft"] if args.draft else [])
    print("| category | " + " | ".join(f"{t} tok/s" for t in tools) + " | "
          + " | ".join(f"{t} speedup" for t in tools[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(tools) - 1))
    for c in cats:
        rate = {t: agg[(c, t)]["tokens"] / agg[(c, t)]["seconds"] for t in tools if (c, t) in agg}
        if "plain" not in rate:
            continue
        print(f"| {c} | " + " | ".join(f"{rate[t]:.1f}" for t in tools) + " | "
              + " | ".join(f"{rate[t] / rate['plain']:.2f}x" for t in tools[1:]) + " |")
    return {"augur": ours, "llama.cpp": theirs}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["speed", "prefill", "spec"])
    ap.add_argument("models", nargs="*", help="speed: the GGUF files")
    ap.add_argument("--llama-bin", required=True)
    ap.add_argument("--augur", default="target/release/augur")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--pp-list", default="128,512,2048", help="prefill: the prompt lengths")
    ap.add_argument("--model", help="spec: the target GGUF")
    ap.add_argument("--draft", help="spec: the draft GGUF (same tokenizer)")
    ap.add_argument("--draft-max", type=int, default=4, help="spec: llama.cpp's --spec-draft-n-max")
    ap.add_argument("--prompts")
    ap.add_argument("--limit", type=int, default=2)
    ap.add_argument("--categories")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--augur-json", help="spec: reuse this earlier `augur bench --json` output instead of running augur")
    args = ap.parse_intermixed_args()
    result = {"speed": speed, "prefill": prefill, "spec": spec}[args.mode](args)
    with open(args.out + f".{args.mode}.json", "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
