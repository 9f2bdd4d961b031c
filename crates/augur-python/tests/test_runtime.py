"""The GIL is released while the engine runs; Ctrl-C (KeyboardInterrupt) stops a generation at once and leaves
the model usable; a streamer's exception ends the generation; threads share a model safely."""

import _thread
import signal
import threading
import time

import pytest

import augur


@pytest.fixture
def sigint_raises():
    """Python's own SIGINT handler for the test's length: a process started in the background by a non-interactive
    shell inherits SIGINT ignored, and then `interrupt_main` does nothing (Python installs no handler over an
    ignored signal)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_gil_is_released_while_generating(qwen, qwen_tokenizer):
    ids = qwen_tokenizer("def quicksort(items):")["input_ids"]
    thread = threading.Thread(target=qwen.generate, kwargs=dict(input_ids=[ids], max_new_tokens=24))
    thread.start()
    spins, start = 0, time.perf_counter()
    while thread.is_alive():
        spins += 1
    elapsed = time.perf_counter() - start
    thread.join()
    # Python runs ~10^7 loop turns a second; with the GIL held by the engine it would get almost none.
    assert elapsed > 0.2 and spins / elapsed > 1e5, (spins, elapsed)


def test_keyboard_interrupt_cancels_promptly(qwen, qwen_tokenizer, sigint_raises):
    ids = qwen_tokenizer("Count from one to a thousand:")["input_ids"]
    seen = []

    class Record(augur.BaseStreamer):
        def put(self, value):
            seen.append(len(value))

        def end(self):
            seen.append("end")

    timer = threading.Timer(1.0, _thread.interrupt_main)
    start = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # 800 tokens take far longer than the test allows: only the interrupt ends this call in time.
        qwen.generate(input_ids=[ids], max_new_tokens=800, eos_token_id=None, streamer=Record())
    elapsed = time.perf_counter() - start
    timer.join()
    assert elapsed < 4.0, elapsed
    assert len(seen) > 2 and seen[-1] == "end", "tokens were streamed before the interrupt, then end()"
    out = qwen.generate(input_ids=[ids], max_new_tokens=3)
    assert len(out[0]) == len(ids) + 3


def test_streamer_exception_ends_generation(tiny_llama, tiny_tokenizer):
    ids = tiny_tokenizer("Alice")["input_ids"]

    class Broken(augur.BaseStreamer):
        def __init__(self):
            self.calls = 0

        def put(self, value):
            self.calls += 1
            if self.calls == 3:
                raise RuntimeError("streamer broke")

        def end(self):
            pass

    broken = Broken()
    with pytest.raises(RuntimeError, match="streamer broke"):
        tiny_llama.generate(input_ids=[ids], max_new_tokens=50, eos_token_id=None, streamer=broken)
    assert broken.calls == 3
    assert len(tiny_llama.generate(input_ids=[ids], max_new_tokens=5, eos_token_id=None)[0]) == len(ids) + 5


def test_threads_share_one_model(tiny_llama, tiny_tokenizer):
    prompts = ["Alice", "The cat sat", "def add(a, b):", "Bob and"]
    expected = {p: tiny_llama.generate(input_ids=[tiny_tokenizer(p)["input_ids"]], max_new_tokens=20,
                                       eos_token_id=None) for p in prompts}
    results, errors = {}, []

    def work(p):
        try:
            for _ in range(5):
                out = tiny_llama.generate(input_ids=[tiny_tokenizer(p)["input_ids"]], max_new_tokens=20,
                                          eos_token_id=None, prompt_lookup_num_tokens=3)
                results.setdefault(p, []).append(out)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert all(out == expected[p] for p in prompts for out in results[p]) and len(results) == len(prompts)


def test_keyboard_interrupt_without_a_streamer_within_half_a_second(qwen, qwen_tokenizer, sigint_raises):
    ids = qwen_tokenizer("Count from one to a thousand:")["input_ids"]
    interrupted = []

    def interrupt():
        interrupted.append(time.perf_counter())
        _thread.interrupt_main()

    timer = threading.Timer(1.0, interrupt)
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        # 800 tokens take far longer than the test allows: only the interrupt ends this call in time.
        qwen.generate(input_ids=[ids], max_new_tokens=800, eos_token_id=None)
    raised = time.perf_counter()
    timer.join()
    assert interrupted and raised - interrupted[0] < 0.5, raised - interrupted[0]
    out = qwen.generate(input_ids=[ids], max_new_tokens=3)
    assert len(out[0]) == len(ids) + 3


def test_two_models_as_each_others_assistants_do_not_deadlock(tiny_llama, tiny_assistant, tiny_tokenizer):
    ids = tiny_tokenizer("The cat sat")["input_ids"]
    errors = []

    def work(model, assistant=None, new=8):
        try:
            model.generate(input_ids=[ids], max_new_tokens=new, eos_token_id=None, assistant_model=assistant)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    for _ in range(6):
        # A long generation holds A while B-with-A and A-with-B line up behind it: when A is free, whichever
        # of the two takes it next must not be left waiting for the model the other holds.
        holder = threading.Thread(target=work, args=(tiny_llama, None, 400), daemon=True)
        holder.start()
        time.sleep(0.05)
        pair = [threading.Thread(target=work, args=(tiny_llama, tiny_assistant), daemon=True),
                threading.Thread(target=work, args=(tiny_assistant, tiny_llama), daemon=True)]
        for t in pair:
            t.start()
            time.sleep(0.02)
        for t in [holder, *pair]:
            t.join(60)  # only to catch the deadlock
        assert not any(t.is_alive() for t in [holder, *pair]), "the two generations deadlocked"
    assert not errors, errors
