"""The assisted-decoding guide's snippets, run as written with Transformers and with augur's Python package on the
same Hugging Face directories (bf16 safetensors, `dtype="auto"`), alternated rep by rep in one process.

For each backend and each mode (plain; with `assistant_model`), it times `model.generate(**inputs, ...)` on a chat
prompt (greedy, `max_new_tokens` new tokens, prefill included) and, with `--prefill N`, a generate of one token
after an N-token prompt (the prefill). Medians over `--reps`, and whether the backends' tokens agree.

Usage:
    python tools/gguf_to_hf.py ~/.cache/augur/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf /tmp/qwen15-bf16
    python tools/gguf_to_hf.py ~/.cache/augur/models/qwen2.5-coder-0.5b-instruct.gguf /tmp/qwen05-bf16
    python tools/bench/guide_snippets.py --target /tmp/qwen15-bf16 --assistant /tmp/qwen05-bf16 --threads 2

Needs torch==2.15.0 and transformers==5.24.0 (pip install torch==2.15.0 transformers==5.24.0; about 5.6 GB with the CUDA libraries of the PyPI wheel) and augur's package
(`pip install ./crates/augur-python`) in one environment.
"""
import argparse
import json
import statistics
import time

import torch

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring and tests."


def backend(name):
    if name == "transformers":
        import transformers as lib
    else:
        import augur as lib
    return lib


def load(lib, target, assistant):
    tokenizer = lib.AutoTokenizer.from_pretrained(target)
    model = lib.AutoModelForCausalLM.from_pretrained(target, dtype="auto")
    assistant_model = lib.AutoModelForCausalLM.from_pretrained(assistant, dtype="auto") if assistant else None
    return tokenizer, model, assistant_model


def chat_inputs(tokenizer):
    return tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                         return_tensors="pt", return_dict=True)


def timed_generate(model, inputs, **kw):
    t = time.perf_counter()
    out = model.generate(**inputs, do_sample=False, **kw)
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--assistant")
    ap.add_argument("--backends", default="augur,transformers")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=0, help="also time a prompt of this many tokens (0: skip)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    names = a.backends.split(",")
    loaded = {n: load(backend(n), a.target, a.assistant) for n in names}
    modes = ["plain"] + (["assisted"] if a.assistant else [])
    times = {(n, m): [] for n in names for m in modes + (["prefill"] if a.prefill else [])}
    tokens = {}
    for rep in range(a.reps + 1):  # rep 0 warms up (pages the weights in)
        for n in names:
            tokenizer, model, assistant_model = loaded[n]
            inputs = chat_inputs(tokenizer)
            for m in modes:
                kw = {"max_new_tokens": a.max_new_tokens}
                if m == "assisted":
                    kw["assistant_model"] = assistant_model
                secs, out = timed_generate(model, inputs, **kw)
                new = out[0][inputs["input_ids"].shape[1]:].tolist()
                tokens[(n, m)] = new
                if rep:
                    times[(n, m)].append((secs, len(new)))
            if a.prefill:
                ids = torch.tensor([[(7 * i + 11) % 30000 + 100 for i in range(a.prefill)]])
                secs, _ = timed_generate(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                         max_new_tokens=1)
                if rep:
                    times[(n, "prefill")].append((secs, a.prefill))
    rows = []
    for (n, m), runs in times.items():
        secs = statistics.median(s for s, _ in runs)
        count = runs[0][1]
        rows.append({"backend": n, "mode": m, "seconds": secs, "tokens": count, "tokens_per_s": count / secs})
        print(f"{n:<12} {m:<9} {count:>4} tokens  {secs:7.2f} s  {count / secs:7.1f} tok/s")
    for m in modes:
        if len(names) == 2:
            same = tokens[(names[0], m)] == tokens[(names[1], m)]
            print(f"{m}: {names[0]} and {names[1]} tokens {'identical' if same else 'differ'}")
    for n in names:
        if "assisted" in modes:
            same = tokens[(n, "plain")] == tokens[(n, "assisted")]
            print(f"{n}: assisted tokens {'identical to' if same else 'differ from'} plain")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
