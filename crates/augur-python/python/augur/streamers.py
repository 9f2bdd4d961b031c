"""Streamers as Transformers defines them: `generate` calls `put(token_ids)` with the prompt first, then with each
block of accepted tokens as it lands (a speculative round accepts several at once), and `end()` once done."""

from queue import Queue

from . import _arrays


class BaseStreamer:
    """What `generate(streamer=...)` calls; subclass it and implement both."""

    def put(self, value):
        raise NotImplementedError()

    def end(self):
        raise NotImplementedError()


def _ids(value):
    rows, _ = _arrays.to_rows(value, "value") if len(value) else ([[]], None)
    if len(rows) > 1:
        raise ValueError("TextStreamer only supports batch size 1")
    return rows[0]


def _is_cjk(cp):
    """Whether `cp` is a CJK ideograph, after which text may break without a space."""
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class TextStreamer(BaseStreamer):
    """Prints text to stdout as it is generated, a word at a time (whole lines, or after each CJK character),
    as Transformers' `TextStreamer`; `skip_prompt` leaves the prompt out; `decode_kwargs` go to `decode`
    (`skip_special_tokens=True`, say)."""

    def __init__(self, tokenizer, skip_prompt=False, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.decode_kwargs = decode_kwargs
        self.token_cache = []
        self.print_len = 0
        self.next_tokens_are_prompt = True

    def put(self, value):
        ids = _ids(value)
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.token_cache.extend(ids)
        text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
        if text.endswith("\n"):
            printable = text[self.print_len:]
            self.token_cache = []
            self.print_len = 0
        elif text and _is_cjk(ord(text[-1])):
            printable = text[self.print_len:]
            self.print_len += len(printable)
        else:
            printable = text[self.print_len:text.rfind(" ") + 1]
            self.print_len += len(printable)
        self.on_finalized_text(printable)

    def end(self):
        if self.token_cache:
            text = self.tokenizer.decode(self.token_cache, **self.decode_kwargs)
            printable = text[self.print_len:]
            self.token_cache = []
            self.print_len = 0
        else:
            printable = ""
        self.next_tokens_are_prompt = True
        self.on_finalized_text(printable, stream_end=True)

    def on_finalized_text(self, text, stream_end=False):
        """Where finished text goes: stdout here; override it to send text elsewhere."""
        print(text, flush=True, end="" if not stream_end else None)


class TextIteratorStreamer(TextStreamer):
    """Text as an iterator, for a generation running on another thread (`Thread(target=model.generate,
    kwargs=...)`); `timeout` (seconds) bounds each wait and raises `queue.Empty` when it runs out."""

    def __init__(self, tokenizer, skip_prompt=False, timeout=None, **decode_kwargs):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue = Queue()
        self.stop_signal = None
        self.timeout = timeout

    def on_finalized_text(self, text, stream_end=False):
        self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self):
        return self

    def __next__(self):
        value = self.text_queue.get(timeout=self.timeout)
        if value == self.stop_signal:
            raise StopIteration()
        return value
