#!/usr/bin/env python3
"""Multi-turn workloads through an OpenAI-compatible `augur serve`, one speculation setting against another.

Each conversation runs turn by turn (each answer joins the history, greedy, `max_tokens` per turn) once per
setting, the settings taking turns conversation by conversation so that a slow spell of the machine reaches them
alike. Every setting runs under an API key of its own (start the server with `--api-key` listing as many keys as
settings, see --keys), so suffix decoding's cache of earlier answers holds only that setting's own answers: a
setting never drafts from another setting's identical text. Reports, per setting, completion tokens over
seconds (prefill included, measured by the client) and its ratio to the first setting, and the decode rate alone
(tokens after each turn's first text over the seconds after it: the server re-reads the whole history each turn,
and that prefill weighs on every setting alike); checks that every
setting's answers are the first setting's, token for token (greedy output is plain greedy output).

A setting is the JSON value of augur's `speculation` field, or an object of request fields with it
(`{"speculation": "off", "cache_prompt": false}`: plain decoding that prefills the whole history every turn;
the server reuses the previous turn's cached prefix unless told not to). Each turn's line gives the prompt
tokens read from that cache.

Workloads: `mt-bench` (the two-turn questions of Spec-Bench's question.jsonl: the second turn revises or extends
the first answer) and `edit` (a small Python file revised over ten turns, each answer the whole file again).
Standard library only.

    python3 tools/bench/multiturn.py --url http://127.0.0.1:8080 --workload edit --keys k0,k1,k2,k3 \
        --settings '"off"' '{"method": "suffix", "suffix_global_cache": false}' '{"method": "suffix"}' \
        '{"method": "auto"}'
"""

import argparse
import json
import time
import urllib.request

EDIT_FILE = '''def mean(xs):
    total = 0
    for x in xs:
        total += x
    return total / len(xs)


def variance(xs):
    m = mean(xs)
    total = 0
    for x in xs:
        total += (x - m) ** 2
    return total / len(xs)


def describe(xs):
    return {"mean": mean(xs), "variance": variance(xs), "count": len(xs)}
'''

EDITS = [
    "Here is a Python module:\n\n```python\n" + EDIT_FILE + "```\n\nAdd a docstring to every function. "
    "Reply with the whole file and nothing else.",
    "Add type hints to every function. Reply with the whole file and nothing else.",
    "Make mean and variance raise ValueError on an empty list. Reply with the whole file and nothing else.",
    "Rename describe to summarize. Reply with the whole file and nothing else.",
    "Add a function stdev that returns the square root of the variance, using math.sqrt. Reply with the whole "
    "file and nothing else.",
    "Make summarize include the standard deviation under the key \"stdev\". Reply with the whole file and "
    "nothing else.",
    "Use sum() in mean instead of the loop. Reply with the whole file and nothing else.",
    "Add a function median. Reply with the whole file and nothing else.",
    "Make summarize include the median. Reply with the whole file and nothing else.",
    "Add a __all__ list at the top naming the public functions. Reply with the whole file and nothing else.",
]


def conversations(workload, path, limit):
    if workload == "edit":
        return [EDITS]
    convs = []
    with open(path) as f:
        for line in f:
            q = json.loads(line)
            if len(q["turns"]) > 1:
                convs.append(q["turns"])
    return convs[:limit]


def fields(setting):
    """A setting's request fields: `{"speculation": ..., "cache_prompt": false}` as written, any other value as
    the `speculation` field alone."""
    if isinstance(setting, dict) and "speculation" in setting:
        return setting
    return {"speculation": setting}


def ask(url, key, messages, max_tokens, setting):
    """One streamed turn: its text, usage, seconds in all and seconds from its first text to its end."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **fields(setting),
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    t = time.perf_counter()
    text, usage, first = [], None, None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    return "".join(text), usage, end - t, end - (first or end)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--workload", choices=["mt-bench", "edit"], default="edit")
    ap.add_argument("--questions", default="data/spec_bench/question.jsonl", help="Spec-Bench questions (mt-bench)")
    ap.add_argument("--limit", type=int, default=4, help="mt-bench conversations")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--keys", required=True, help="comma-separated API keys, one per setting")
    ap.add_argument("--settings", nargs="+", required=True,
                    help="JSON values of augur's `speculation` field, or objects of request fields with it")
    args = ap.parse_args()
    settings = [json.loads(s) for s in args.settings]
    keys = args.keys.split(",")
    if len(keys) < len(settings):
        raise SystemExit("--keys: one key per setting")
    # tokens, seconds, forwards, draft sources, tokens after each turn's first text, seconds after it
    totals = [[0, 0.0, 0, {}, 0, 0.0] for _ in settings]
    mismatches = 0
    for c, turns in enumerate(conversations(args.workload, args.questions, args.limit)):
        answers = []
        for s, (setting, key) in enumerate(zip(settings, keys)):
            messages, mine = [], []
            for t, turn in enumerate(turns):
                messages.append({"role": "user", "content": turn})
                text, u, seconds, decoding = ask(args.url, key, messages, args.max_tokens, setting)
                messages.append({"role": "assistant", "content": text})
                mine.append(text)
                spec = u["speculation"]
                totals[s][0] += u["completion_tokens"]
                totals[s][1] += seconds
                totals[s][4] += u["completion_tokens"] - 1
                totals[s][5] += decoding
                totals[s][2] += spec["target_forwards"]
                for k, v in spec.get("draft_sources", {}).items():
                    totals[s][3][k] = totals[s][3].get(k, 0) + v
                cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                print(f"conv {c} turn {t} {json.dumps(setting):<50} {u['completion_tokens']:>4} tokens "
                      f"{seconds:7.2f} s {u['completion_tokens'] / seconds:6.1f} tok/s "
                      f"{cached:>5}/{u['prompt_tokens']} prompt tokens cached "
                      f"{spec['tokens_per_forward']:.2f} tok/forward {spec.get('draft_sources', {})}", flush=True)
            if s > 0 and mine != answers[0]:
                mismatches += 1
                print(f"conv {c}: setting {json.dumps(setting)} answered differently from the first setting")
            answers.append(mine)
    base = totals[0][0] / totals[0][1]
    base_decode = totals[0][4] / totals[0][5]
    for setting, (tokens, seconds, forwards, sources, after, decoding) in zip(settings, totals):
        rate, decode = tokens / seconds, after / decoding
        print(json.dumps({"setting": setting, "tokens": tokens, "seconds": round(seconds, 2),
                          "tok_per_s": round(rate, 2), "vs_first": round(rate / base, 3),
                          "decode_tok_per_s": round(decode, 2), "decode_vs_first": round(decode / base_decode, 3),
                          "tokens_per_forward": round(tokens / max(forwards, 1), 2), "draft_sources": sources}))
    if mismatches:
        raise SystemExit(f"{mismatches} conversations differ from the first setting's")


if __name__ == "__main__":
    main()
