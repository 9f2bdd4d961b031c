#!/usr/bin/env python3
"""Prompt lookup replayed offline over plain greedy answers.

Greedy speculation is lossless, so the drafts prompt lookup would propose, and how many of them the target
keeps, follow from the plain greedy answer alone. This decodes Spec-Bench prompts once with `augur generate`
and then replays lookup choices over them without a model:

  collect: plain greedy answers of the first N prompts per category (Qwen2.5 chat template), with the prompt's
           token ids (from the `tokenizers` package; checked against augur's prompt token count).
  replay:  at every answer position, tokens kept after a one-token match and, after a two-token match, from the
           leftmost occurrence (Transformers), the most recent one and the one whose match reaches furthest
           back; then the cost-aware loop (a copy of cost_model.rs's rules) replayed with the k-token cost
           1 + SLOPE·(k − 1) one-token forwards, per category, prefill included and after the prompt, next to
           drafts that an oracle cuts to exactly what the target keeps.

Usage:
  tools/bench/lookup_replay.py collect --augur target/release/augur --model Q.gguf --tokenizer tokenizer.json \
      --prompts data/spec_bench/question.jsonl --per-category 4 --max-new-tokens 128 --out answers.jsonl
  tools/bench/lookup_replay.py replay answers.jsonl [--slope 0.16]

The tokenizer may be Qwen3's tokenizer.json (`augur pull tokenizer-qwen`): same byte-level BPE as Qwen2.5.
"""
import argparse
import collections
import json
import subprocess
import tempfile

SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
DRAFT = 10  # prompt_lookup_num_tokens


def collect(args):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(args.tokenizer)
    seen = collections.Counter()
    with open(args.out, "w") as out, tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        for line in open(args.prompts):
            q = json.loads(line)
            if seen[q["category"]] >= args.per_category:
                continue
            seen[q["category"]] += 1
            text = q["turns"][0]
            f.seek(0)
            f.truncate()
            f.write(text)
            f.flush()
            res = json.loads(subprocess.run(
                [args.augur, "generate", "--model", args.model, "--chat", "--json", "--threads", str(args.threads),
                 "--max-new-tokens", str(args.max_new_tokens), "--prompt-file", f.name],
                capture_output=True, text=True, check=True).stdout)
            rendered = (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
                        "<|im_start|>assistant\n")
            prompt = tok.encode(rendered, add_special_tokens=False).ids
            assert len(prompt) == res["stats"]["prompt_tokens"], f"question {q['question_id']}: template differs"
            s = res["stats"]
            out.write(json.dumps({"question_id": q["question_id"], "category": q["category"], "prompt": prompt,
                                  "tokens": res["tokens"], "seconds": s["seconds"],
                                  "prefill_seconds": s["prefill_seconds"]}) + "\n")


def occurrences(ids, n):
    """Starts of earlier occurrences of the last n tokens whose continuation is non-empty."""
    tail = ids[-n:]
    return [j for j in range(len(ids) - n) if ids[j:j + n] == tail]


def reach(ids, j, n, cap=64):
    """Tokens matched by the occurrence at j, followed back from its n-gram (as prompt_lookup.rs, up to 64)."""
    m = n
    while m < cap and j - (m - n) - 1 >= 0 and ids[j - (m - n) - 1] == ids[len(ids) - m - 1]:
        m += 1
    return m


def kept(draft, future):
    a = 0
    for x, y in zip(draft, future):
        if x != y:
            break
        a += 1
    return a


def lookup(ids, limit, choice):
    """prompt_lookup.rs: `left` is Transformers' search, `reach` the cost-aware one (no one-token drafts)."""
    for n in (2, 1):
        occ = occurrences(ids, n)
        if not occ:
            continue
        if choice == "left":
            j = occ[0]
        else:
            reaches = [reach(ids, o, n) for o in occ]
            if max(reaches) < 2:
                return []
            j = max(zip(reaches, occ))[1]
        return ids[j + n:j + n + limit]
    return []


class CostModel:
    """cost_model.rs for a drafter without a prefill of its own, with deterministic costs."""
    DECAY, PROBE, FIRST_BACKOFF, MAX_BACKOFF, MIN_GAIN, MAX_GAMMA = 0.7, 3, 4, 64, 1.02, 32

    def __init__(self):
        self.plain = self.draft = self.verify = None
        self.accepted = self.rejected = 0.0
        self.rounds = self.skip = 0
        self.backoff, self.probing = self.FIRST_BACKOFF, False

    def best_gamma(self):
        if None in (self.plain, self.draft, self.verify):
            return None
        alpha = (self.accepted + 1) / (self.accepted + self.rejected + 2)
        best, best_rate = 0, self.MIN_GAIN / self.plain
        for g in range(1, self.MAX_GAMMA + 1):
            rate = (1 - alpha ** (g + 1)) / (1 - alpha) / (self.plain + g * (self.draft + self.verify))
            if rate > best_rate:
                best, best_rate = g, rate
        return best

    def next_cap(self):
        if self.rounds == 0:
            return self.PROBE
        if self.rounds == 1 and self.plain is None:
            return 0
        if self.skip > 0:
            self.skip -= 1
            if self.skip == 0:
                self.probing = True
                return self.PROBE
            return 0
        g = self.best_gamma()
        if g == 0:
            self.skip, self.backoff = self.backoff, min(2 * self.backoff, self.MAX_BACKOFF)
            return 0
        return self.PROBE if g is None else g

    def ema(self, old, x):
        return x if old is None else self.DECAY * old + (1 - self.DECAY) * x

    def record(self, gamma, accepted, verify_seconds):
        first = self.rounds == 0
        self.rounds += 1
        if first:
            if gamma > 0:
                self.draft = 0.0
                self.count(gamma, accepted)
            return
        if gamma == 0:
            self.plain = self.ema(self.plain, verify_seconds)
            return
        if self.plain is not None:
            self.verify = self.ema(self.verify, max((verify_seconds - self.plain) / gamma, 0.0))
        self.draft = self.ema(self.draft, 0.0)
        self.count(gamma, accepted)
        if self.probing:
            self.probing = False
            if self.best_gamma():
                self.backoff = self.FIRST_BACKOFF

    def count(self, gamma, accepted):
        self.accepted = self.accepted * self.DECAY + accepted
        self.rejected = self.rejected * self.DECAY + (1 if accepted < gamma else 0)


def replay_loop(prompt, ids, choice, prefill, slope):
    """Seconds, in one-token forwards, of the cost-aware loop over a known greedy answer."""
    pos, cost, first, model = len(prompt), 0.0, True, CostModel()
    while pos < len(ids):
        cap = min(model.next_cap(), len(ids) - pos - 1)
        draft = lookup(ids[:pos], min(cap, DRAFT), choice) if cap > 0 else []
        a = kept(draft, ids[pos:])
        seconds = prefill if first else 1 + slope * len(draft)
        first = False
        cost += seconds
        model.record(len(draft), a, seconds)
        pos += a + 1
    return cost


def replay_oracle(prompt, ids, slope):
    """One-token forwards after the prompt when each round drafts exactly the tokens the target keeps, from the
    best of the occurrences above: a bound on what lookup can do."""
    pos, cost = len(prompt), 0.0
    while pos < len(ids):
        ctx, future = ids[:pos], ids[pos:]
        best = 0
        for n in (2, 1):
            for j in occurrences(ctx, n):
                best = max(best, kept(ctx[j + n:j + n + min(DRAFT, len(ids) - pos - 1)], future))
        if pos > len(prompt):
            cost += 1 + slope * best
        pos += best + 1
    return cost


def replay(args):
    answers = [json.loads(line) for line in open(args.answers)]
    stats = collections.defaultdict(lambda: [0, 0, 0])
    for d in answers:
        p, ids = d["prompt"], d["prompt"] + d["tokens"]
        for pos in range(len(p), len(ids)):
            ctx, future = ids[:pos], ids[pos:]
            occ = occurrences(ctx, 2)
            if occ:
                reaches = [reach(ctx, o, 2) for o in occ]
                picks = {"leftmost": occ[0], "most recent": occ[-1], "furthest back": max(zip(reaches, occ))[1]}
                picks = {k: (j, 2) for k, j in picks.items()}
            elif occurrences(ctx, 1):
                picks = {"one-token match (leftmost)": (occurrences(ctx, 1)[0], 1)}
            else:
                continue
            for name, (j, n) in picks.items():
                a = kept(ctx[j + n:j + n + DRAFT], future)
                s = stats[name]
                s[0] += 1
                s[1] += a
                s[2] += a > 0
    print(f"{len(answers)} answers, every position, drafts of {DRAFT}\n")
    print("| match, occurrence | positions | tokens kept (mean) | first token kept |")
    print("|---|---:|---:|---:|")
    for name, (n, total, first) in stats.items():
        print(f"| {name} | {n} | {total / n:.2f} | {first / n:.0%} |")

    sums = collections.defaultdict(lambda: [0.0] * 6)
    for d in answers:
        n = len(d["tokens"])
        step = (d["seconds"] - d["prefill_seconds"]) / max(n - 1, 1)
        prefill = d["prefill_seconds"] / step
        ids = d["prompt"] + d["tokens"]
        row = [prefill + n - 1] + [replay_loop(d["prompt"], ids, c, prefill, args.slope) for c in ("left", "reach")]
        # After the prompt: plain's prefill off both sides (the first round's drafts ride on the prefill).
        row += [n - 1, replay_loop(d["prompt"], ids, "reach", 0.0, args.slope),
                replay_oracle(d["prompt"], ids, args.slope)]
        for cat in (d["category"], "overall"):
            sums[cat] = [a + b for a, b in zip(sums[cat], row)]
    print(f"\ncost-aware loop replayed, k-token forward = 1 + {args.slope}·(k − 1) one-token forwards\n")
    print("| category | Transformers' occurrence | furthest back, no one-token drafts | the same, after the prompt "
          "| oracle drafts, after the prompt |")
    print("|---|---:|---:|---:|---:|")
    for cat in sorted(c for c in sums if c != "overall") + ["overall"]:
        plain, left, far, after, far_after, oracle = sums[cat]
        print(f"| {cat} | {plain / left:.3f}x | {plain / far:.3f}x | {after / far_after:.2f}x "
              f"| {after / oracle:.2f}x |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--augur", default="target/release/augur")
    c.add_argument("--model", required=True)
    c.add_argument("--tokenizer", required=True)
    c.add_argument("--prompts", required=True)
    c.add_argument("--per-category", type=int, default=4)
    c.add_argument("--max-new-tokens", type=int, default=128)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", required=True)
    r = sub.add_parser("replay")
    r.add_argument("answers")
    r.add_argument("--slope", type=float, default=0.16)
    args = ap.parse_args()
    collect(args) if args.mode == "collect" else replay(args)


if __name__ == "__main__":
    main()
