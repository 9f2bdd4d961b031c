"""`AutoTokenizer` and the tokenizer object it returns, shaped like Transformers' fast tokenizers."""

from . import _arrays
from ._attrdict import AttrDict
from ._native import Tokenizer as _NativeTokenizer


class BatchEncoding(AttrDict):
    """What calling a tokenizer returns: `input_ids` and `attention_mask`, as keys and as attributes."""

    def to(self, device):
        """Moves torch tensors to `device` (augur runs on the CPU, so this is for code written for Transformers)."""
        return BatchEncoding({k: (v.to(device) if _arrays.kind_of(v) == "pt" else v) for k, v in self.items()})


class PreTrainedTokenizer:
    """A model's tokenizer (byte-level BPE, SentencePiece-style or WordPiece, as its `tokenizer.json` or GGUF
    metadata says) with its special tokens and chat template."""

    def __init__(self, native, name_or_path=None):
        self._native = native
        self.name_or_path = name_or_path or native.path
        self.padding_side = "left"
        self._pad_token_id = native.pad_token_id

    @property
    def vocab_size(self):
        return self._native.vocab_size

    def __len__(self):
        return self._native.vocab_size

    bos_token = property(lambda self: self._native.bos_token)
    bos_token_id = property(lambda self: self._native.bos_token_id)
    eos_token = property(lambda self: self._native.eos_token)
    unk_token = property(lambda self: self._native.unk_token)
    chat_template = property(lambda self: self._native.chat_template)

    @property
    def eos_token_id(self):
        ids = self._native.eos_token_ids
        return ids[0] if ids else None

    @property
    def pad_token_id(self):
        return self._pad_token_id

    @pad_token_id.setter
    def pad_token_id(self, value):
        self._pad_token_id = value

    @property
    def pad_token(self):
        return None if self._pad_token_id is None else self._native.id_to_token(self._pad_token_id)

    @pad_token.setter
    def pad_token(self, token):
        if token is None:
            self._pad_token_id = None
            return
        token_id = self._native.token_to_id(token)
        if token_id is None:
            raise ValueError(f"pad token {token!r} is not in the vocabulary")
        self._pad_token_id = token_id

    def __repr__(self):
        return f"PreTrainedTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size})"

    def encode(self, text, add_special_tokens=True, return_tensors=None):
        ids = self._native.encode(_text(text), bool(add_special_tokens))
        kind = _arrays.tensor_kind(return_tensors)
        return ids if kind is None else _arrays.from_rows([ids], kind)

    def __call__(self, text, add_special_tokens=True, padding=False, return_tensors=None, return_attention_mask=True,
                 truncation=None, max_length=None):
        """Encodes one text or a list of texts; `padding` (True / "longest") pads to the longest on
        `padding_side` with the pad token (the EOS token when there is none), as batched generation needs."""
        if truncation or max_length is not None:
            raise ValueError("augur's tokenizer does not truncate; pass text that fits the model's context")
        kind = _arrays.tensor_kind(return_tensors)
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        rows = [self._native.encode(_text(t), bool(add_special_tokens)) for t in texts]
        masks = [[1] * len(r) for r in rows]
        if padding not in (False, None, True, "longest", "do_not_pad"):
            raise ValueError(f"padding={padding!r} is not supported (use True or 'longest')")
        lengths = {len(r) for r in rows}
        if padding in (True, "longest") and len(lengths) > 1:
            pad = self._pad_token_id if self._pad_token_id is not None else self.eos_token_id
            if pad is None:
                raise ValueError("Asking to pad but the tokenizer does not have a padding token. Please select a "
                                 "token to use as `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)`")
            longest = max(lengths)
            for i, r in enumerate(rows):
                fill = longest - len(r)
                if self.padding_side == "left":
                    rows[i], masks[i] = [pad] * fill + r, [0] * fill + masks[i]
                else:
                    rows[i], masks[i] = r + [pad] * fill, masks[i] + [0] * fill
        elif kind is not None and len(lengths) > 1:
            raise ValueError("Unable to create tensor, you should probably activate padding with 'padding=True' to "
                             "have batched tensors with the same length.")
        if kind is not None:
            out = {"input_ids": _arrays.from_rows(rows, kind)}
            if return_attention_mask:
                out["attention_mask"] = _arrays.from_rows(masks, kind)
        else:
            out = {"input_ids": rows[0] if single else rows}
            if return_attention_mask:
                out["attention_mask"] = masks[0] if single else masks
        return BatchEncoding(out)

    def decode(self, token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        if clean_up_tokenization_spaces:
            raise ValueError("augur decodes as the tokenizer's own `clean_up_tokenization_spaces` says; "
                             "it cannot be turned on per call")
        rows, _ = _arrays.to_rows(token_ids, "token_ids") if _nonempty(token_ids) else ([[]], None)
        if len(rows) != 1:
            raise TypeError("decode takes one sequence of token ids; use batch_decode for several")
        return self._native.decode(rows[0], bool(skip_special_tokens))

    def batch_decode(self, sequences, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        rows, _ = _arrays.to_rows(sequences, "sequences")
        return [self.decode(r, skip_special_tokens, clean_up_tokenization_spaces) for r in rows]

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._native.token_to_id(tokens)
        return [self._native.token_to_id(t) for t in tokens]

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._native.id_to_token(ids)
        return [self._native.id_to_token(i) for i in ids]

    def apply_chat_template(self, conversation, add_generation_prompt=False, tokenize=True, return_tensors=None,
                            return_dict=False, continue_final_message=False, **kwargs):
        """Renders `conversation` (a list of `{"role", "content"}` dicts) with the model's chat template; with
        `tokenize` (the default, as in Transformers) returns its token ids (no special tokens added: the
        template writes them)."""
        if kwargs:
            raise TypeError(f"apply_chat_template() got unexpected keyword arguments {sorted(kwargs)}: augur's "
                            f"templates take only the messages")
        if continue_final_message:
            raise ValueError("augur does not support `continue_final_message`")
        text = self._native.apply_chat_template(_messages(conversation), bool(add_generation_prompt))
        if not tokenize:
            return text
        ids = self._native.encode(text, False)
        kind = _arrays.tensor_kind(return_tensors)
        if return_dict:
            if kind is None:
                return BatchEncoding({"input_ids": ids, "attention_mask": [1] * len(ids)})
            return BatchEncoding({"input_ids": _arrays.from_rows([ids], kind),
                                  "attention_mask": _arrays.from_rows([[1] * len(ids)], kind)})
        return ids if kind is None else _arrays.from_rows([ids], kind)


class AutoTokenizer:
    """`AutoTokenizer.from_pretrained(path_or_name)`: a GGUF file, a Hugging Face model directory, a
    `tokenizer.json`, a catalogue name (pulled when missing) or a repo id in the local Hugging Face cache."""

    def __init__(self):
        raise EnvironmentError("AutoTokenizer is designed to be instantiated using the "
                               "`AutoTokenizer.from_pretrained(pretrained_model_name_or_path)` method.")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        _refuse_load_kwargs("AutoTokenizer.from_pretrained", kwargs, allowed={"use_fast": True, "trust_remote_code": None})
        name = str(pretrained_model_name_or_path)
        return PreTrainedTokenizer(_NativeTokenizer.load(name), name)


def _refuse_load_kwargs(where, kwargs, allowed):
    """Loading options that would change nothing here pass; anything else is refused, never ignored."""
    for key, value in kwargs.items():
        if key not in allowed:
            raise TypeError(f"{where}() got an unexpected keyword argument '{key}'")
        expected = allowed[key]
        if isinstance(expected, tuple):
            if value not in expected:
                raise ValueError(f"{where}: augur takes {key} in {expected}, not {value!r}")
        elif expected is not None and value != expected:
            raise ValueError(f"{where}: augur takes only {key}={expected!r}, not {value!r}")


def _text(text):
    if not isinstance(text, str):
        raise TypeError(f"text input must be of type `str` (single example), `list[str]` (batch), not "
                        f"{type(text).__name__}")
    return text


def _nonempty(ids):
    try:
        return len(ids) > 0
    except TypeError:
        return True


def _messages(conversation):
    if hasattr(conversation, "messages"):
        conversation = conversation.messages
    out = []
    for i, m in enumerate(conversation):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"message {i} must be a dict with 'role' and 'content'")
        if not isinstance(m["content"], str):
            raise ValueError(f"message {i}: augur's chat templates take text content only")
        out.append((str(m["role"]), m["content"]))
    return out
