"""Token ids through the Python API equal the committed Transformers 5.24 goldens on the tiny fixtures: plain
greedy, every assisted method with its knobs set where Transformers users set them, and the MTP pipeline."""

import pytest

import augur
from conftest import fixture, fixture_path, golden

np = pytest.importorskip("numpy", reason="numpy is in the test extra (pip install ./crates/augur-python[test])")

_models = {}


def load(path):
    if path not in _models:
        _models[path] = augur.AutoModelForCausalLM.from_pretrained(path)
    return _models[path]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-gemma3"])
def test_greedy_equals_transformers(name):
    g = golden(name)
    tokenizer = augur.AutoTokenizer.from_pretrained(fixture(name))
    model = load(fixture(name))
    for prompt in g["prompts"]:
        if prompt["messages"]:
            ids = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True)
        else:
            ids = tokenizer(prompt["text"], add_special_tokens=False)["input_ids"]
        assert ids == prompt["input_ids"]
        out = model.generate(np.array([ids]), max_new_tokens=g["max_new_tokens"], eos_token_id=None)
        assert isinstance(out, np.ndarray) and out.dtype == np.int64
        assert out[0, :len(ids)].tolist() == ids
        assert out[0, len(ids):].tolist() == prompt["greedy"]


def _run_configs(configs, max_new, call_knobs, assistant_knobs):
    checked = drafted = 0
    for config in configs:
        target = load(fixture_path(config["target"]))
        assistant = load(fixture_path(config["assistant"])) if config.get("assistant") else None
        saved = None
        if assistant is not None:
            saved = assistant.generation_config
            assistant.generation_config = augur.GenerationConfig(**{**saved.to_dict(), **assistant_knobs(config)})
        try:
            for run in config["runs"]:
                out = target.generate(input_ids=[run["input_ids"]], assistant_model=assistant, do_sample=False,
                                      max_new_tokens=max_new, eos_token_id=None, cost_aware_drafting=False,
                                      assistant_confidence_adaptive=False, return_dict_in_generate=True,
                                      **call_knobs(config))
                assert out.sequences[0][len(run["input_ids"]):] == run["output"], config
                drafted += out.stats[0]["drafted"]
                checked += 1
        finally:
            if saved is not None:
                assistant.generation_config = saved
    return checked, drafted


def test_assistant_and_prompt_lookup_equal_transformers():
    g = golden("speculative")
    checked, drafted = _run_configs(
        g["configs"], g["max_new_tokens"],
        call_knobs=lambda c: c.get("settings_on_generate_call", {}),
        assistant_knobs=lambda c: c.get("settings_on_assistant_generation_config", {}))
    assert checked == sum(len(c["runs"]) for c in g["configs"]) and drafted > 0


def test_early_exit_and_ensemble_equal_transformers():
    g = golden("early_exit")

    def call(c):
        knobs = dict(c["knobs"]) if c["knobs_on"] == "target.generation_config" else {}
        for key in ("assistant_early_exit", "assistant_ensemble_weight"):
            if c[key] is not None:
                knobs[key] = c[key]
        return knobs

    checked, drafted = _run_configs(
        g["configs"], g["max_new_tokens"], call_knobs=call,
        assistant_knobs=lambda c: c["knobs"] if c["knobs_on"] == "assistant.generation_config" else {})
    assert checked == sum(len(c["runs"]) for c in g["configs"]) and drafted > 0


def test_universal_assisted_decoding_equals_transformers():
    g = golden("universal")
    target = load(fixture_path(g["target"]))
    assistant = load(fixture_path(g["assistant"]))
    tokenizer = augur.AutoTokenizer.from_pretrained(fixture_path(g["target"]))
    assistant_tokenizer = augur.AutoTokenizer.from_pretrained(fixture_path(g["assistant"]))
    drafted = 0
    for config in g["configs"]:
        knobs = config["settings_on_assistant_generation_config"]
        for run in config["runs"]:
            out = target.generate(input_ids=[run["input_ids"]], assistant_model=assistant, tokenizer=tokenizer,
                                  assistant_tokenizer=assistant_tokenizer, do_sample=False,
                                  max_new_tokens=g["max_new_tokens"], eos_token_id=None, pad_token_id=g["pad_token_id"],
                                  cost_aware_drafting=False, assistant_confidence_adaptive=False,
                                  return_dict_in_generate=True, **knobs)
            assert out.sequences[0][len(run["input_ids"]):] == run["output"]
            assert out.stats[0]["method"] == "universal_assisted"
            drafted += out.stats[0]["drafted"]
    assert drafted > 0


@pytest.mark.parametrize("name", ["tiny-deepseek-v3-mtp", "tiny-glm4-moe-mtp", "tiny-deepseek-v3-mtp2"])
def test_mtp_pipeline_equals_transformers(name):
    g = golden("mtp")
    pipe = augur.pipeline("text-generation", model=fixture(name))
    for prompt in g["models"][name]["prompts"]:
        out = pipe(prompt["text"], use_mtp=True, do_sample=False, max_new_tokens=g["max_new_tokens"],
                   eos_token_id=None, add_special_tokens=True, return_tensors=True)
        new = out[0]["generated_token_ids"][len(prompt["input_ids"]):]
        assert new == prompt["greedy"]
