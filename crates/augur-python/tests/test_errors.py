"""Unknown or conflicting options raise Transformers' exceptions with its wording; the engine's errors arrive
as Python exceptions with its text; bad input never hangs or crashes the interpreter."""

import pytest

import augur
from conftest import fixture


def ids_of(tokenizer, text="Alice and Bob"):
    return tokenizer(text)["input_ids"]


@pytest.mark.parametrize("kwargs,pattern", [
    ({"foo": 1}, r"The following `model_kwargs` are not used by the model: \['foo'\]"),
    ({"num_beams": 4}, r"augur does not implement `num_beams=4`"),
    ({"output_scores": True}, r"augur does not implement `output_scores=True`"),
    ({"do_sample": True, "temperature": -1.0}, r"temperature"),
    ({"max_new_tokens": "ten"}, r"max_new_tokens"),
    ({"top_p": -0.1, "do_sample": True}, r"`top_p` has to be a float > 0 and < 1"),
    ({"num_assistant_tokens_schedule": "sometimes", "assistant_early_exit": 1}, r"num_assistant_tokens_schedule"),
    ({"assistant_ensemble_weight": 0.5, "prompt_lookup_num_tokens": 3}, r"not supported with prompt lookup"),
    ({"use_mtp": True}, r"num_mtp_layers"),
])
def test_bad_options_raise_value_error(tiny_llama, tiny_tokenizer, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        tiny_llama.generate(input_ids=[ids_of(tiny_tokenizer)], **kwargs)


def test_neutral_values_of_unimplemented_options_pass(tiny_llama, tiny_tokenizer):
    out = tiny_llama.generate(input_ids=[ids_of(tiny_tokenizer)], num_beams=1, use_cache=True, output_scores=False,
                              max_new_tokens=3)
    assert len(out[0]) == len(ids_of(tiny_tokenizer)) + 3


def test_universal_assisted_decoding_needs_both_tokenizers(tiny_llama, tiny_tokenizer):
    assistant = augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-qwen2-metaspace"))
    with pytest.raises(ValueError, match=r"The main and assistant models have different tokenizers\. Please provide "
                                         r"`tokenizer` and `assistant_tokenizer` to `generate\(\)`"):
        tiny_llama.generate(input_ids=[ids_of(tiny_tokenizer)], assistant_model=assistant)


def test_assistant_tokenizer_refused_when_tokenizers_match(tiny_llama, tiny_tokenizer, tiny_assistant):
    with pytest.raises(ValueError, match=r"`assistant_tokenizer` is not required when the main and assistant models "
                                         r"use the same tokenizer"):
        tiny_llama.generate(input_ids=[ids_of(tiny_tokenizer)], assistant_model=tiny_assistant,
                            tokenizer=tiny_tokenizer, assistant_tokenizer=tiny_tokenizer)


def test_a_model_cannot_draft_for_itself(tiny_llama, tiny_tokenizer):
    with pytest.raises(ValueError, match="another model"):
        tiny_llama.generate(input_ids=[ids_of(tiny_tokenizer)], assistant_model=tiny_llama)


def test_gemma4_assistant_does_not_generate_alone():
    assistant = augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-gemma4-assistant"))
    with pytest.raises(ValueError, match="Gemma 4 assistant"):
        assistant.generate(input_ids=[[1, 2, 3]], max_new_tokens=2)


def test_bad_inputs(tiny_llama, tiny_tokenizer):
    with pytest.raises(TypeError, match="input_ids"):
        tiny_llama.generate(input_ids="Alice")
    with pytest.raises(ValueError, match="empty"):
        tiny_llama.generate(input_ids=[[]])
    with pytest.raises(ValueError, match="512"):
        tiny_llama.generate(input_ids=[[5] * 600])
    with pytest.raises(ValueError, match="attention_mask"):
        tiny_llama.generate(input_ids=[[5, 6, 7]], attention_mask=[[1, 1]])
    with pytest.raises(ValueError, match="batch size 1"):
        tiny_llama.generate(input_ids=[[5, 6], [7, 8]], streamer=augur.TextStreamer(tiny_tokenizer))
    with pytest.raises(ValueError, match="logits_processor"):
        tiny_llama.generate(input_ids=[[5, 6]], logits_processor=[lambda ids, scores: scores])
    with pytest.raises(TypeError, match="generation_config"):
        tiny_llama.generate(input_ids=[[5, 6]], generation_config={"max_new_tokens": 3})


def test_token_outside_the_vocabulary(tiny_llama):
    with pytest.raises(ValueError, match="vocab"):
        tiny_llama.generate(input_ids=[[5, 100000]], max_new_tokens=2)


def test_loading_errors(tmp_path):
    with pytest.raises(OSError):
        augur.AutoModelForCausalLM.from_pretrained(str(tmp_path / "missing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(OSError, match="bad.gguf"):
        augur.AutoModelForCausalLM.from_pretrained(str(bad))
    with pytest.raises(OSError, match="bad.gguf"):
        augur.AutoTokenizer.from_pretrained(str(bad))
    with pytest.raises(TypeError, match="unexpected keyword argument 'revision'"):
        augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"), revision="main")
    with pytest.raises(ValueError, match="torch_dtype"):
        augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"), torch_dtype="float16")
    with pytest.raises(ValueError, match="foo"):
        augur.GenerationConfig(foo=1)
    with pytest.raises(KeyError, match="summarization"):
        augur.pipeline("summarization", model=fixture("tiny-llama"))
