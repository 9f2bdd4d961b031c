"""The snippets of Transformers' assisted-decoding guide, with `transformers` replaced by `augur`: on the tiny
fixtures and on real GGUF models. Each checks what the snippet is for: the output it should give, and that the
method it names drafted."""

import pytest

from augur import AutoModelForCausalLM, AutoTokenizer, pipeline
from conftest import QWEN, SMOLLM, fixture


def _drafted(model, inputs, **kwargs):
    out = model.generate(**inputs, return_dict_in_generate=True, **kwargs)
    return out.sequences, out.stats[0]


@pytest.mark.parametrize("models", [("tiny-llama", "tiny-llama-assistant"), (QWEN, QWEN)], ids=["tiny", "gguf"])
def test_guide_assistant_model(models):
    target_name, assistant_name = models
    target_name = fixture(target_name) if target_name.startswith("tiny") else target_name
    assistant_name = fixture(assistant_name) if assistant_name.startswith("tiny") else assistant_name
    tokenizer = AutoTokenizer.from_pretrained(target_name)
    model = AutoModelForCausalLM.from_pretrained(target_name)
    assistant_model = AutoModelForCausalLM.from_pretrained(assistant_name)
    inputs = tokenizer("Hugging Face is an open-source company", return_tensors="np")

    outputs = model.generate(**inputs, assistant_model=assistant_model, do_sample=True, max_new_tokens=20, seed=7,
                             cost_aware_drafting=False)
    text = tokenizer.batch_decode(outputs, skip_special_tokens=True)
    assert len(text) == 1 and text[0].startswith("Hugging Face is an open-source company")
    assert outputs.shape[1] > inputs["input_ids"].shape[1]

    plain = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    greedy, stats = _drafted(model, inputs, assistant_model=assistant_model, do_sample=False, max_new_tokens=20,
                             cost_aware_drafting=False)
    assert stats["method"] == "assistant_model" and stats["drafted"] > 0
    assert greedy.tolist() == plain.tolist()


@pytest.mark.parametrize("name", ["tiny-llama", QWEN], ids=["tiny", "gguf"])
def test_guide_prompt_lookup(name):
    name = fixture(name) if name.startswith("tiny") else name
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name)
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    inputs = tokenizer(prompt, return_tensors="np")
    outputs = model.generate(**inputs, prompt_lookup_num_tokens=10, max_new_tokens=20)
    plain = model.generate(**inputs, max_new_tokens=20)
    assert outputs.tolist() == plain.tolist()
    _, stats = _drafted(model, inputs, prompt_lookup_num_tokens=10, max_new_tokens=20, cost_aware_drafting=False)
    assert stats["method"] == "prompt_lookup" and stats["drafted"] > 0
    assert tokenizer.batch_decode(outputs, skip_special_tokens=True)[0].startswith(prompt)


@pytest.mark.parametrize("name", ["tiny-llama", QWEN], ids=["tiny", "gguf"])
def test_guide_early_exit(name):
    name = fixture(name) if name.startswith("tiny") else name
    tokenizer = AutoTokenizer.from_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name)
    inputs = tokenizer("Alice and Bob", return_tensors="np")
    outputs = model.generate(**inputs, assistant_early_exit=4 if name == QWEN else 1, do_sample=False,
                             max_new_tokens=20)
    plain = model.generate(**inputs, do_sample=False, max_new_tokens=20)
    assert outputs.tolist() == plain.tolist()
    _, stats = _drafted(model, inputs, assistant_early_exit=4 if name == QWEN else 1, max_new_tokens=20,
                        cost_aware_drafting=False)
    assert stats["method"] == "early_exit" and stats["drafted"] > 0


@pytest.mark.parametrize("models", [("tiny-llama", "tiny-qwen2-metaspace"), (QWEN, SMOLLM)], ids=["tiny", "gguf"])
def test_guide_universal_assisted_decoding(models):
    target_name, assistant_name = (fixture(m) if m.startswith("tiny") else m for m in models)
    tokenizer = AutoTokenizer.from_pretrained(target_name)
    assistant_tokenizer = AutoTokenizer.from_pretrained(assistant_name)
    model = AutoModelForCausalLM.from_pretrained(target_name)
    assistant_model = AutoModelForCausalLM.from_pretrained(assistant_name)
    inputs = tokenizer("Alice and Bob", return_tensors="np")
    outputs = model.generate(**inputs, assistant_model=assistant_model, tokenizer=tokenizer,
                             assistant_tokenizer=assistant_tokenizer, max_new_tokens=20)
    plain = model.generate(**inputs, max_new_tokens=20)
    assert outputs.tolist() == plain.tolist()
    _, stats = _drafted(model, inputs, assistant_model=assistant_model, tokenizer=tokenizer,
                        assistant_tokenizer=assistant_tokenizer, max_new_tokens=20, cost_aware_drafting=False)
    assert stats["method"] == "universal_assisted" and stats["drafted"] > 0


def test_guide_pipeline_use_mtp():
    pipe = pipeline("text-generation", model=fixture("tiny-deepseek-v3-mtp"))
    outputs = pipe("Hugging Face is an open-source company", use_mtp=True, do_sample=False, max_new_tokens=50,
                   add_special_tokens=True, return_full_text=True)
    plain = pipe("Hugging Face is an open-source company", do_sample=False, max_new_tokens=50,
                 add_special_tokens=True, return_full_text=True)
    assert outputs == plain
    assert outputs[0]["generated_text"].startswith("Hugging Face is an open-source company")
    inputs = pipe.tokenizer("Hugging Face is an open-source company", return_tensors="np")
    _, stats = _drafted(pipe.model, inputs, use_mtp=True, max_new_tokens=50, cost_aware_drafting=False)
    assert stats["method"] == "mtp" and stats["drafted"] > 0


def test_guide_pipeline_with_assistant_on_gguf():
    pipe = pipeline("text-generation", model=QWEN, assistant_model=QWEN)
    out = pipe("def fibonacci(n):", max_new_tokens=20, do_sample=False)
    plain = pipeline("text-generation", model=pipe.model)("def fibonacci(n):", max_new_tokens=20, do_sample=False)
    assert out == plain and out[0]["generated_text"].startswith("def fibonacci(n):")
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    answer = pipe(chat, max_new_tokens=12, do_sample=False)
    messages = answer[0]["generated_text"]
    assert messages[:1] == chat and messages[1]["role"] == "assistant"
    assert "Paris" in messages[1]["content"]
