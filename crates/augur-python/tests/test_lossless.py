"""Greedy speculative output equals plain greedy output through Python, token for token, for every method, and
each run drafted (so the equality is not plain decoding compared with itself)."""

import pytest

import augur
from conftest import QWEN, SMOLLM, fixture

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n"
    "def factorial(n):\n",
    "The cat sat on the mat. The cat sat on the",
    "Alice and Bob are",
]

_cache = {}


def model(name):
    if name not in _cache:
        _cache[name] = augur.AutoModelForCausalLM.from_pretrained(fixture(name) if name.startswith("tiny") else name)
    return _cache[name]


def tokenizer(name):
    key = ("tok", name)
    if key not in _cache:
        _cache[key] = augur.AutoTokenizer.from_pretrained(fixture(name) if name.startswith("tiny") else name)
    return _cache[key]


def methods():
    yield "prompt_lookup", "tiny-llama", {"prompt_lookup_num_tokens": 5}
    yield "prompt_lookup", QWEN, {"prompt_lookup_num_tokens": 10}
    yield "assistant_model", "tiny-llama", {"assistant_model": "tiny-llama-assistant"}
    yield "assistant_model", QWEN, {"assistant_model": QWEN}
    yield "early_exit", "tiny-llama", {"assistant_early_exit": 2}
    yield "early_exit", QWEN, {"assistant_early_exit": 12}
    yield "universal_assisted", "tiny-llama", {"assistant_model": "tiny-qwen2-metaspace", "universal": True}
    yield "universal_assisted", QWEN, {"assistant_model": SMOLLM, "universal": True}
    yield "mtp", "tiny-deepseek-v3-mtp", {"use_mtp": True}
    yield "mtp", "tiny-glm4-moe-mtp", {"use_mtp": True}
    yield "gemma4_assistant", "tiny-gemma4", {"assistant_model": "tiny-gemma4-assistant"}
    # Tree drafts, under vLLM's option names.
    yield "prompt_lookup", QWEN, {"prompt_lookup_num_tokens": 10, "speculative_eagle_topk": 3, "tree": True}
    yield "assistant_model", "tiny-llama", {"assistant_model": "tiny-llama-assistant", "speculative_eagle_topk": 2,
                                            "speculative_num_draft_tokens": 12, "assistant_confidence_threshold": 0.9,
                                            "tree": True}


@pytest.mark.parametrize("method,target,options", list(methods()),
                         ids=[f"{m}-{t}" + ("-tree" if o.get("tree") else "") for m, t, o in methods()])
def test_greedy_speculative_equals_plain(method, target, options):
    options = dict(options)
    universal = options.pop("universal", False)
    tree = options.pop("tree", False)
    if "assistant_model" in options:
        name = options["assistant_model"]
        # One loaded model cannot draft for itself: the target's own file as assistant is loaded a second time.
        options["assistant_model"] = model(name) if name != target else augur.AutoModelForCausalLM.from_pretrained(name)
        if universal:
            options["tokenizer"] = tokenizer(target)
            options["assistant_tokenizer"] = tokenizer(name)
    m = model(target)
    tok = tokenizer(target) if not target.startswith("tiny-gemma4") else m._tokenizer
    drafted = tree_rounds = 0
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        plain = m.generate(input_ids=[ids], max_new_tokens=24, eos_token_id=None)
        out = m.generate(input_ids=[ids], max_new_tokens=24, eos_token_id=None, cost_aware_drafting=False,
                         return_dict_in_generate=True, **options)
        assert out.sequences == plain, (method, prompt)
        assert out.stats[0]["method"] == method
        drafted += out.stats[0]["drafted"]
        tree_rounds += out.stats[0]["tree_rounds"]
    assert drafted > 0
    # Trees that branched were verified (and only where asked for).
    assert (tree_rounds > 0) == tree, tree_rounds
