"""`pipeline("text-generation", ...)` as Transformers shapes its inputs and outputs."""

from .modeling import AugurModelForCausalLM, AutoModelForCausalLM
from .tokenization import AutoTokenizer, PreTrainedTokenizer


def _model(value, what):
    if isinstance(value, AugurModelForCausalLM):
        return value
    if isinstance(value, str) or hasattr(value, "__fspath__"):
        return AutoModelForCausalLM.from_pretrained(str(value))
    raise TypeError(f"`{what}` must be a path, a name or a model loaded by augur, not {type(value).__name__}")


def _tokenizer(value):
    if value is None or isinstance(value, PreTrainedTokenizer):
        return value
    if isinstance(value, str) or hasattr(value, "__fspath__"):
        return AutoTokenizer.from_pretrained(str(value))
    raise TypeError(f"`tokenizer` must be a path, a name or a tokenizer loaded by augur, not {type(value).__name__}")


def _is_chat(value):
    return isinstance(value, (list, tuple)) and len(value) > 0 and all(isinstance(m, dict) for m in value)


class TextGenerationPipeline:
    """Calls with a text, a list of texts, chat messages (a list of `{"role", "content"}`) or a list of chats;
    returns `[{"generated_text": ...}]` per input, with the prompt ahead of the new text (`return_full_text`,
    default True) or, for a chat, the messages followed by the new assistant message."""

    def __init__(self, model, tokenizer=None, assistant_model=None, assistant_tokenizer=None, **generate_kwargs):
        self.model = model
        self.tokenizer = tokenizer or model._tokenizer
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer of its own: pass `tokenizer`")
        self.assistant_model = assistant_model
        self.assistant_tokenizer = assistant_tokenizer
        self._generate_kwargs = generate_kwargs

    def __call__(self, text_inputs, return_full_text=None, return_tensors=None, return_text=None,
                 clean_up_tokenization_spaces=None, prefix=None, stop_sequence=None, continue_final_message=None,
                 skip_special_tokens=None, **generate_kwargs):
        if return_full_text is not None and return_text is not None:
            raise ValueError("`return_text` is mutually exclusive with `return_full_text`")
        if return_full_text is not None and return_tensors is not None:
            raise ValueError("`return_full_text` is mutually exclusive with `return_tensors`")
        if continue_final_message:
            raise ValueError("augur does not support `continue_final_message`")
        kwargs = dict(self._generate_kwargs)
        kwargs.update(generate_kwargs)
        add_special_tokens = bool(kwargs.pop("add_special_tokens", False))
        if stop_sequence is not None:
            kwargs["stop_strings"] = [stop_sequence] if isinstance(stop_sequence, str) else list(stop_sequence)
        if self.assistant_model is not None:
            kwargs["assistant_model"] = self.assistant_model
        if self.assistant_tokenizer is not None:
            kwargs["tokenizer"] = self.tokenizer
            kwargs["assistant_tokenizer"] = self.assistant_tokenizer
        if isinstance(text_inputs, str) or _is_chat(text_inputs):
            return self._one(text_inputs, add_special_tokens, return_full_text, return_tensors, prefix,
                             clean_up_tokenization_spaces, skip_special_tokens, kwargs)
        return [self._one(t, add_special_tokens, return_full_text, return_tensors, prefix,
                          clean_up_tokenization_spaces, skip_special_tokens, kwargs) for t in text_inputs]

    def _one(self, prompt, add_special_tokens, return_full_text, return_tensors, prefix, clean_up, skip_special,
             kwargs):
        chat = not isinstance(prompt, str)
        if chat:
            if prompt[-1].get("role") == "assistant":
                raise ValueError("augur does not support `continue_final_message` (a chat ending in an assistant "
                                 "message)")
            ids = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=True)
        else:
            ids = self.tokenizer.encode((prefix or "") + prompt, add_special_tokens=add_special_tokens)
        sequences = self.model.generate(input_ids=[ids], **kwargs)
        new = sequences[0][len(ids):]
        if return_tensors:
            return [{"generated_token_ids": sequences[0]}]
        skip = True if skip_special is None else skip_special
        text = self.tokenizer.decode(new, skip_special_tokens=skip, clean_up_tokenization_spaces=clean_up)
        if return_full_text is False:
            return [{"generated_text": text}]
        if chat:
            return [{"generated_text": list(prompt) + [{"role": "assistant", "content": text}]}]
        return [{"generated_text": prompt + text}]


def pipeline(task=None, model=None, tokenizer=None, assistant_model=None, assistant_tokenizer=None, device=None,
             device_map=None, dtype=None, torch_dtype=None, **kwargs):
    """`pipeline("text-generation", model=..., assistant_model=...)`; `model` and `assistant_model` are paths,
    names or loaded models; other keyword arguments become defaults of every call's `generate`."""
    if task not in ("text-generation", None):
        raise KeyError(f"Unknown task {task}, augur supports ['text-generation']")
    if model is None:
        raise RuntimeError("Impossible to instantiate a pipeline without either a task or a model being specified.")
    for name, value, allowed in (("device", device, (None, "cpu", -1)), ("device_map", device_map, (None, "cpu", "auto")),
                                 ("dtype", dtype, (None, "auto")), ("torch_dtype", torch_dtype, (None, "auto"))):
        if str(value) not in {str(a) for a in allowed}:
            raise ValueError(f"pipeline: augur takes {name} in {allowed}, not {value!r}")
    target = _model(model, "model")
    assistant = None if assistant_model is None else _model(assistant_model, "assistant_model")
    return TextGenerationPipeline(target, _tokenizer(tokenizer), assistant, _tokenizer(assistant_tokenizer), **kwargs)
