"""Batched rows through the Python API against the same rows one by one (run with the package installed:
`pip install ./crates/augur-python`). Rows run as forks whose forwards batch; the outputs must be equal.

    python tools/bench/python_rows.py [--model qwen2.5-coder-0.5b] [--rows 4] [--max-new-tokens 32] [--reps 3]
"""

import argparse
import statistics
import time

import augur

PROMPTS = ["def quicksort(items):", "The capital of France is", "import numpy as np\n", "Once upon a time",
           "SELECT name FROM users WHERE", "Dear Sir or Madam,", "fn main() {", "The three laws of motion are"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    model = augur.AutoModelForCausalLM.from_pretrained(args.model)
    tokenizer = augur.AutoTokenizer.from_pretrained(args.model)
    prompts = PROMPTS[:args.rows]
    batch = tokenizer(prompts, padding=True)
    kw = dict(max_new_tokens=args.max_new_tokens, eos_token_id=None)
    batched, single = [], []
    for _ in range(args.reps):  # alternated
        before = model._native.batched_forwards
        start = time.perf_counter()
        rows = model.generate(**batch, **kw)
        batched.append(time.perf_counter() - start)
        merged = model._native.batched_forwards - before
        start = time.perf_counter()
        alone = [model.generate(input_ids=[tokenizer(p)["input_ids"]], **kw)[0] for p in prompts]
        single.append(time.perf_counter() - start)
        width = len(batch["input_ids"][0])
        assert all(r[width:] == a[len(a) - args.max_new_tokens:] for r, a in zip(rows, alone)), "rows differ"
    b, s = statistics.median(batched), statistics.median(single)
    tokens = args.rows * args.max_new_tokens
    print(f"{args.model}: {args.rows} rows x {args.max_new_tokens} new tokens, median of {args.reps}: batched "
          f"{b:.2f} s ({tokens / b:.1f} tok/s, {merged} forwards batched in the last run), one by one {s:.2f} s "
          f"({tokens / s:.1f} tok/s): {s / b:.2f}x; outputs equal")


if __name__ == "__main__":
    main()
