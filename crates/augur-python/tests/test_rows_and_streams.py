"""Batched rows equal single runs (speculation per row); streamed text equals returned text; streamers see
speculative blocks; return types follow the input's."""

import threading

import pytest

import augur
from conftest import QWEN, fixture

np = pytest.importorskip("numpy", reason="numpy is in the test extra (pip install ./crates/augur-python[test])")

PROMPTS = ["The cat sat on the mat. The cat sat on the", "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
           "Alice"]


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("method", ["prompt_lookup", "assistant_model"])
def test_batched_rows_equal_single_runs(tiny_llama, tiny_tokenizer, tiny_assistant, side, method):
    options = {"prompt_lookup_num_tokens": 4} if method == "prompt_lookup" else {"assistant_model": tiny_assistant}
    tiny_tokenizer.padding_side = side
    try:
        batch = tiny_tokenizer(PROMPTS, padding=True, return_tensors="np")
    finally:
        tiny_tokenizer.padding_side = "left"
    assert len({len(tiny_tokenizer(p)["input_ids"]) for p in PROMPTS}) > 1, "the rows must need padding"
    merged = tiny_llama._native.batched_forwards
    out = tiny_llama.generate(**batch, max_new_tokens=16, cost_aware_drafting=False, return_dict_in_generate=True,
                              **options)
    assert tiny_llama._native.batched_forwards > merged, "the rows ran as forks whose forwards batched"
    assert out.sequences.shape[0] == len(PROMPTS)
    width = batch["input_ids"].shape[1]
    for i, prompt in enumerate(PROMPTS):
        ids = tiny_tokenizer(prompt)["input_ids"]
        alone = tiny_llama.generate(input_ids=[ids], max_new_tokens=16, cost_aware_drafting=False, **options)[0]
        new = alone[len(ids):]
        row = out.sequences[i].tolist()
        assert row[:width] == batch["input_ids"][i].tolist()
        assert row[width:width + len(new)] == new
        assert all(t == 0 for t in row[width + len(new):])  # the pad token (tiny-llama's EOS)
        assert out.stats[i]["method"] == method
    assert sum(s["drafted"] for s in out.stats) > 0


def test_return_type_follows_input(tiny_llama, tiny_tokenizer):
    ids = tiny_tokenizer("Alice")["input_ids"]
    as_list = tiny_llama.generate(input_ids=[ids], max_new_tokens=4)
    assert isinstance(as_list, list) and isinstance(as_list[0], list)
    assert tiny_llama.generate(input_ids=ids, max_new_tokens=4) == as_list
    as_np = tiny_llama.generate(input_ids=np.array([ids]), max_new_tokens=4)
    assert isinstance(as_np, np.ndarray) and as_np.tolist() == as_list


def test_torch_in_torch_out(tiny_llama, tiny_tokenizer):
    torch = pytest.importorskip("torch", reason="torch is not installed here (CI does not install it: the torch "
                                "round trip is checked only where it is)")
    as_list = tiny_llama.generate(input_ids=[tiny_tokenizer("Alice")["input_ids"]], max_new_tokens=4)
    as_pt = tiny_llama.generate(**tiny_tokenizer("Alice", return_tensors="pt"), max_new_tokens=4)
    assert isinstance(as_pt, torch.Tensor) and as_pt.tolist() == as_list


class Blocks(augur.BaseStreamer):
    def __init__(self):
        self.blocks, self.ended = [], 0

    def put(self, value):
        self.blocks.append(list(value))

    def end(self):
        self.ended += 1


def test_streamer_receives_prompt_then_speculative_blocks(qwen, qwen_tokenizer):
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    ids = qwen_tokenizer(prompt)["input_ids"]
    streamer = Blocks()
    out = qwen.generate(input_ids=[ids], prompt_lookup_num_tokens=10, max_new_tokens=30, streamer=streamer,
                        cost_aware_drafting=False)
    assert streamer.blocks[0] == ids and streamer.ended == 1
    assert sum(streamer.blocks[1:], []) == out[0][len(ids):]
    assert max(len(b) for b in streamer.blocks[1:]) > 1, "prompt lookup should accept several tokens in a round"


def test_text_iterator_streamer_equals_returned_text(qwen, qwen_tokenizer):
    chat = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    ids = qwen_tokenizer.apply_chat_template(chat, add_generation_prompt=True)
    streamer = augur.TextIteratorStreamer(qwen_tokenizer, skip_prompt=True, skip_special_tokens=True, timeout=60)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=qwen.generate(
        input_ids=[ids], max_new_tokens=40, streamer=streamer, prompt_lookup_num_tokens=10)))
    thread.start()
    pieces = list(streamer)
    thread.join(60)
    assert not thread.is_alive()
    new = result["out"][0][len(ids):]
    assert len(pieces) > 1
    assert "".join(pieces) == qwen_tokenizer.decode(new, skip_special_tokens=True)


def test_text_streamer_prints_prompt_and_text(tiny_llama, tiny_tokenizer, capsys):
    ids = tiny_tokenizer("The cat sat on the mat.")["input_ids"]
    out = tiny_llama.generate(input_ids=[ids], max_new_tokens=12, eos_token_id=None,
                              streamer=augur.TextStreamer(tiny_tokenizer))
    printed = capsys.readouterr().out
    assert printed == tiny_tokenizer.decode(out[0]) + "\n"
