"""`AutoModelForCausalLM` and the model object it returns."""

import json

from . import generation
from ._native import Model as _NativeModel
from .tokenization import PreTrainedTokenizer, _refuse_load_kwargs


class ModelConfig:
    """The model's shape and special ids under Transformers' config names (`vocab_size`, `num_hidden_layers`,
    `eos_token_id`, ...)."""

    def __init__(self, fields):
        self.__dict__.update(fields)

    def to_dict(self):
        return dict(self.__dict__)

    def get_text_config(self):
        return self

    def __repr__(self):
        return f"ModelConfig {json.dumps(self.__dict__, indent=2, sort_keys=True)}"


class AugurModelForCausalLM:
    """A causal LM loaded by augur: `generate()` as Transformers', run by augur's engine on the CPU."""

    def __init__(self, native, name_or_path):
        self._native = native
        self.name_or_path = name_or_path
        self.config = ModelConfig(native.config)
        # The generation defaults the engine read with the model; `generate` sends only what differs from them.
        self._loaded_defaults = json.loads(native.defaults)
        self.generation_config = generation.GenerationConfig(**{
            k: v for k, v in self._loaded_defaults.items()
            if k in generation.ENGINE_OPTIONS or k in generation.NEUTRAL_OPTIONS
        })
        own = native.tokenizer
        self._tokenizer = None if own is None else PreTrainedTokenizer(own, name_or_path)

    @property
    def device(self):
        """Always the CPU: a `torch.device` when torch is installed (so `.to(model.device)` works), else 'cpu'."""
        try:
            import torch
        except ImportError:
            return "cpu"
        return torch.device("cpu")

    def eval(self):
        return self

    def to(self, device):
        if str(device) != "cpu":
            raise ValueError(f"augur runs on the CPU, not {device}")
        return self

    def __repr__(self):
        return f"AugurModelForCausalLM({self.name_or_path!r}, model_type={self.config.model_type!r})"

    def generate(self, inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None,
                 prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None, streamer=None,
                 negative_prompt_ids=None, negative_prompt_attention_mask=None, custom_generate=None, **kwargs):
        """Generates new tokens after each row of `inputs` (or `input_ids`) and returns the rows followed by them,
        as a list of lists, a numpy array or a torch tensor (whichever the input was); rows that end first are
        padded with `pad_token_id` (the EOS token when there is none).

        Padded rows (with `attention_mask`, or pad tokens in a batch) run as forks whose forwards batch, each
        exactly as it would alone, speculation included (Transformers refuses batched assisted decoding). Every generation option
        augur supports is taken under Transformers' name (`assistant_model`, `prompt_lookup_num_tokens`,
        `assistant_early_exit`, `use_mtp`, `do_sample`, `max_new_tokens`, ...); an unknown name, or an option
        augur does not implement at a value that would change the output, raises `ValueError`.
        `return_dict_in_generate=True` returns `sequences` with augur's `stats` per row. The GIL is released
        while the engine runs; Ctrl-C raises `KeyboardInterrupt` at the next accepted token."""
        return generation.generate(self, inputs, generation_config, logits_processor, stopping_criteria,
                                   prefix_allowed_tokens_fn, synced_gpus, assistant_model, streamer,
                                   negative_prompt_ids, negative_prompt_attention_mask, custom_generate, **kwargs)


class AutoModelForCausalLM:
    """`AutoModelForCausalLM.from_pretrained(path_or_name)`: a GGUF file, a Hugging Face model directory, a
    catalogue name (pulled when missing) or a repo id in the local Hugging Face cache. The weights keep their
    own types (GGUF quantizations, f32/f16/bf16 safetensors, multiplied where they lie in the mapped file); augur
    runs on the CPU. `quantization="q8_0"` or `"q4_k"` quantizes a checkpoint's float weights as they load: faster,
    and LOSSY (the outputs are no longer the checkpoint's); a GGUF file refuses it."""

    def __init__(self):
        raise EnvironmentError("AutoModelForCausalLM is designed to be instantiated using the "
                               "`AutoModelForCausalLM.from_pretrained(pretrained_model_name_or_path)` method.")

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        _refuse_load_kwargs("AutoModelForCausalLM.from_pretrained", kwargs, allowed={
            "device_map": (None, "cpu", "auto"), "dtype": (None, "auto"), "torch_dtype": (None, "auto"),
            "trust_remote_code": None, "low_cpu_mem_usage": None, "quantization": (None, "q8_0", "q4_k"),
        })
        name = str(pretrained_model_name_or_path)
        return AugurModelForCausalLM(_NativeModel.load(name, kwargs.get("quantization")), name)
