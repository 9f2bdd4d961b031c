"""Tokenizer, GenerationConfig and pipeline shapes as Transformers returns them."""

import augur
from conftest import fixture, golden


def test_tokenizer_calls(tiny_tokenizer):
    g = golden("tiny-llama")
    prompt = g["prompts"][0]
    enc = tiny_tokenizer(prompt["text"])
    assert enc.input_ids == prompt["input_ids"] and enc["attention_mask"] == [1] * len(prompt["input_ids"])
    assert tiny_tokenizer.encode(prompt["text"]) == prompt["input_ids"]
    assert tiny_tokenizer.decode(prompt["input_ids"]) == prompt["text"]
    assert tiny_tokenizer.batch_decode([prompt["input_ids"], [0] + prompt["input_ids"]], skip_special_tokens=True) \
        == [prompt["text"], prompt["text"]]
    assert tiny_tokenizer.decode([0]) == "<|endoftext|>" and tiny_tokenizer.decode([0], skip_special_tokens=True) == ""
    assert tiny_tokenizer.eos_token_id == 0 and tiny_tokenizer.eos_token == "<|endoftext|>"
    assert tiny_tokenizer.convert_tokens_to_ids("<|im_start|>") == 1
    assert len(tiny_tokenizer) == 448


def test_chat_template(tiny_tokenizer):
    messages = [{"role": "user", "content": "Hi there"}]
    text = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    ids = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False)
    enc = tiny_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    assert enc["input_ids"] == ids and enc["attention_mask"] == [1] * len(ids)


def test_generation_config_object_and_model_defaults(tiny_llama, tiny_tokenizer):
    ids = tiny_tokenizer("The cat sat on the mat.")["input_ids"]
    config = augur.GenerationConfig(max_new_tokens=7, eos_token_id=[], do_sample=False)
    out = tiny_llama.generate(input_ids=[ids], generation_config=config)
    assert len(out[0]) == len(ids) + 7
    assert len(tiny_llama.generate(input_ids=[ids], generation_config=config, max_new_tokens=3)[0]) == len(ids) + 3
    assert config.max_new_tokens == 7, "the caller's config is not changed"
    saved = tiny_llama.generation_config
    try:
        tiny_llama.generation_config = augur.GenerationConfig(**{**saved.to_dict(), "max_new_tokens": 5,
                                                                 "eos_token_id": []})
        assert len(tiny_llama.generate(input_ids=[ids])[0]) == len(ids) + 5
    finally:
        tiny_llama.generation_config = saved
    loaded = augur.GenerationConfig.from_pretrained(fixture("tiny-llama"))
    assert loaded.eos_token_id == 0 and loaded.pad_token_id == 0


def test_pipeline_shapes(tiny_llama):
    pipe = augur.pipeline("text-generation", model=tiny_llama, max_new_tokens=6)
    one = pipe("The cat", eos_token_id=None)
    assert isinstance(one, list) and one[0]["generated_text"].startswith("The cat")
    new = pipe("The cat", eos_token_id=None, return_full_text=False)
    assert one[0]["generated_text"] == "The cat" + new[0]["generated_text"]
    many = pipe(["The cat", "Alice"], eos_token_id=None)
    assert len(many) == 2 and many[0] == one
    chat = [{"role": "user", "content": "Hi there"}]
    answer = pipe(chat, eos_token_id=None)[0]["generated_text"]
    assert answer[0] == chat[0] and answer[1]["role"] == "assistant" and isinstance(answer[1]["content"], str)


def test_stubs_name_every_export():
    import pathlib

    stubs = (pathlib.Path(augur.__file__).parent / "__init__.pyi").read_text()
    missing = [name for name in augur.__all__ if name != "__version__" and
               f"class {name}" not in stubs and f"def {name}" not in stubs]
    assert not missing


def test_sequence_bias_in_transformers_dict_form(tiny_llama):
    plain = tiny_llama.generate(input_ids=[[5, 6, 7]], max_new_tokens=3, eos_token_id=None)
    first = plain[0][3]
    biased = tiny_llama.generate(input_ids=[[5, 6, 7]], max_new_tokens=3, eos_token_id=None,
                                 sequence_bias={(first,): -100.0})
    assert biased[0][3] != first


def test_quantization_on_load(tiny_tokenizer):
    """`quantization=` quantizes a checkpoint's float weights at load (lossy): it loads and generates; a name
    augur lacks and a GGUF file (quantized already) are refused."""
    import pytest

    ids = tiny_tokenizer("The cat sat on the mat.")["input_ids"]
    model = augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"), quantization="q8_0")
    out = model.generate(input_ids=[ids], max_new_tokens=6, eos_token_id=[], do_sample=False)
    assert len(out[0]) == len(ids) + 6
    with pytest.raises(ValueError, match="quantization"):
        augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"), quantization="q3")


def test_suffix_decoding_drafts_from_the_models_earlier_outputs(tiny_tokenizer):
    """Suffix decoding keeps one cache of earlier outputs per loaded model (as vLLM's suffix method keeps one per
    engine): a repeated prompt drafts from the first call's output (the stats say where drafts came from), a call
    with `suffix_global_cache=False` never does; the tokens are the same every time."""
    model = augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"))
    ids = tiny_tokenizer("a b c")["input_ids"]

    def run(**kwargs):
        out = model.generate(input_ids=[ids], max_new_tokens=24, eos_token_id=[], do_sample=False,
                             suffix_max_depth=16, cost_aware_drafting=False, return_dict_in_generate=True, **kwargs)
        return list(out.sequences[0]), out.stats[0].get("draft_sources", {})

    first, first_sources = run()
    alone, alone_sources = run(suffix_global_cache=False)
    again, again_sources = run()
    assert first_sources.get("cache", 0) == 0 and alone_sources.get("cache", 0) == 0, (first_sources, alone_sources)
    assert again_sources.get("cache", 0) > 0, f"the repeat did not draft from the first output: {again_sources}"
    assert first == alone == again
