"""`GenerationConfig` and `generate()`: Transformers' generation options, checked here by name and handed to the
engine, which validates their values with Transformers' wording."""

import json
import os

from . import _arrays
from ._attrdict import AttrDict

# The options the engine implements, under Transformers' names (plus augur's own, marked).
ENGINE_OPTIONS = (
    "max_new_tokens", "max_length", "min_new_tokens", "min_length", "do_sample", "temperature", "top_k", "top_p",
    "min_p", "repetition_penalty", "sequence_bias", "eos_token_id", "pad_token_id", "bos_token_id", "stop_strings",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "prompt_lookup_num_tokens", "max_matching_ngram_size", "assistant_early_exit", "assistant_ensemble_weight",
    "use_mtp", "assistant_lookbehind", "target_lookbehind",
    # augur's: a sampling seed, the ROC adaptation of the confidence threshold, cost-aware drafting.
    "seed", "assistant_confidence_adaptive", "cost_aware_drafting",
    # EAGLE-3's name: the assistant's reduced draft vocabulary.
    "draft_vocab_size",
    # Tree drafts, under vLLM's and SGLang's names.
    "speculative_eagle_topk", "speculative_num_draft_tokens", "speculative_num_steps",
    # Suffix decoding, under Arctic Inference's names (setting one of the first three chooses it).
    "suffix_max_depth", "suffix_max_spec_factor", "suffix_min_token_prob", "suffix_global_cache",
)

# Transformers' options that augur does not implement, with the values that leave generation as augur runs it:
# those pass, any other value is refused.
NEUTRAL_OPTIONS = {
    "num_beams": (1,), "num_beam_groups": (1,), "num_return_sequences": (1,), "use_cache": (True,),
    "early_stopping": (False,), "max_time": (), "output_attentions": (False,), "output_hidden_states": (False,),
    "output_scores": (False,), "output_logits": (False,), "typical_p": (1.0,), "epsilon_cutoff": (0.0,),
    "eta_cutoff": (0.0,), "top_h": (), "encoder_repetition_penalty": (1.0,), "length_penalty": (1.0,),
    "no_repeat_ngram_size": (0,), "encoder_no_repeat_ngram_size": (0,), "bad_words_ids": (),
    "renormalize_logits": (False,), "forced_bos_token_id": (), "forced_eos_token_id": (),
    "remove_invalid_values": (False,), "exponential_decay_length_penalty": (), "suppress_tokens": (),
    "begin_suppress_tokens": (), "token_healing": (False,), "guidance_scale": (1.0,), "watermarking_config": (),
    "decoder_start_token_id": (), "is_assistant": (False,), "speculation_type": (), "compile_config": (),
    "disable_compile": (False, True), "low_memory": (False,), "penalty_alpha": (), "dola_layers": (),
    "diversity_penalty": (0.0,), "constraints": (), "force_words_ids": (), "prefill_chunk_size": (),
    "cache_implementation": (), "cache_config": (), "max_cache_len": (), "continuous_batching_config": (),
    "return_dict_in_generate": (False, True), "transformers_version": None, "_from_model_config": None,
    "_commit_hash": None,
}


class GenerationConfig:
    """Generation options, as Transformers' `GenerationConfig`: unset fields are `None` and take the model's
    `generation_config.json`, then the defaults."""

    def __init__(self, **kwargs):
        for key in kwargs:
            if key not in ENGINE_OPTIONS and key not in NEUTRAL_OPTIONS:
                raise ValueError(f"GenerationConfig: augur does not know the option `{key}`")
        for key in ENGINE_OPTIONS + tuple(NEUTRAL_OPTIONS):
            setattr(self, key, None)
        for key, value in kwargs.items():
            setattr(self, key, value)

    @classmethod
    def from_pretrained(cls, pretrained_model_name, config_file_name="generation_config.json"):
        """Reads `generation_config.json` from a model directory (or that file itself)."""
        path = os.fspath(pretrained_model_name)
        if os.path.isdir(path):
            path = os.path.join(path, config_file_name)
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))

    def to_dict(self):
        """The fields that are set."""
        return {k: v for k, v in vars(self).items() if v is not None}

    def update(self, **kwargs):
        """Sets the known fields among `kwargs` and returns the others, as Transformers does."""
        unused = {}
        for key, value in kwargs.items():
            if key in ENGINE_OPTIONS or key in NEUTRAL_OPTIONS:
                setattr(self, key, value)
            else:
                unused[key] = value
        return unused

    def __eq__(self, other):
        return isinstance(other, GenerationConfig) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return f"GenerationConfig {json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)}"


class GenerateDecoderOnlyOutput(AttrDict):
    """`return_dict_in_generate=True`: `sequences` (as `generate` returns them) and augur's `stats`, one dict per
    row (drafted, accepted, acceptance_rate, tokens_per_target_forward, seconds, ...); by key or attribute."""


def engine_options(config, kwargs):
    """The JSON object of engine options for a call: `config`'s fields, then `kwargs` (which win). Refuses
    unknown names, and known ones augur does not implement unless their value changes nothing."""
    merged = {}
    explicit_eos_none = False
    for source in (config.to_dict() if config is not None else {}, kwargs):
        for key, value in source.items():
            if key in ENGINE_OPTIONS:
                if key == "eos_token_id" and value is None and source is kwargs:
                    explicit_eos_none = True
                if value is not None:
                    merged[key] = value
            elif key in NEUTRAL_OPTIONS:
                allowed = NEUTRAL_OPTIONS[key]
                if allowed is not None and value is not None and value not in allowed:
                    raise ValueError(f"augur does not implement `{key}={value!r}`"
                                     + (f" (it runs as {key}={allowed[0]!r})" if allowed else ""))
            else:
                raise ValueError(f"The following `model_kwargs` are not used by the model: {[key]} (note: typos in "
                                 f"the generate arguments will also show up in this list)")
    if explicit_eos_none:
        # `eos_token_id=None` passed to generate() turns EOS off in Transformers (the call's value wins).
        merged["eos_token_id"] = []
    if isinstance(merged.get("sequence_bias"), dict):
        # Transformers' dict form {(ids...): bias} as the engine's list form [[[ids...], bias], ...].
        merged["sequence_bias"] = [[list(seq), bias] for seq, bias in merged["sequence_bias"].items()]
    return merged


def _edits(model):
    """The fields of `model.generation_config` that differ from what the engine loaded with the model."""
    return {k: v for k, v in model.generation_config.to_dict().items() if model._loaded_defaults.get(k) != v}


def _real_tokens(row, mask):
    if mask is None:
        return row
    if len(mask) != len(row):
        raise ValueError(f"attention_mask has {len(mask)} positions for a row of {len(row)} tokens")
    return [t for t, m in zip(row, mask) if m]


def generate(model, inputs=None, generation_config=None, logits_processor=None, stopping_criteria=None,
             prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None, streamer=None,
             negative_prompt_ids=None, negative_prompt_attention_mask=None, custom_generate=None, **kwargs):
    """Transformers' `model.generate` on augur: see `AugurModelForCausalLM.generate`."""
    for name, value in (("logits_processor", logits_processor), ("stopping_criteria", stopping_criteria),
                        ("prefix_allowed_tokens_fn", prefix_allowed_tokens_fn),
                        ("negative_prompt_ids", negative_prompt_ids),
                        ("negative_prompt_attention_mask", negative_prompt_attention_mask),
                        ("custom_generate", custom_generate)):
        if value is not None and not (isinstance(value, list) and not value):
            raise ValueError(f"augur does not support `{name}`: its processors and criteria run in the engine")
    if synced_gpus:
        raise ValueError("augur runs on the CPU: `synced_gpus` does not apply")
    tokenizer = kwargs.pop("tokenizer", None)
    has_assistant_tokenizer = "assistant_tokenizer" in kwargs
    assistant_tokenizer = kwargs.pop("assistant_tokenizer", None)
    input_ids = kwargs.pop("input_ids", None)
    attention_mask = kwargs.pop("attention_mask", None)
    if inputs is not None and input_ids is not None:
        raise ValueError(f"`inputs`: {inputs}` were passed alongside `input_ids` which is not allowed. Make sure to "
                         f"either pass `inputs` or input_ids=...")
    if inputs is None:
        inputs = input_ids
    if inputs is None:
        raise ValueError("generate() needs `input_ids` (augur does not start from BOS alone)")
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError("`generation_config` must be an augur GenerationConfig")
    # The model's generation_config as edited since loading (unedited fields are the engine's own defaults
    # already), then the call's generation_config, then the keyword arguments.
    edited = _edits(model)
    if generation_config is not None:
        edited.update(generation_config.to_dict())
    config = GenerationConfig(**edited)
    return_dict = kwargs.get("return_dict_in_generate", config.return_dict_in_generate)
    options = engine_options(config, kwargs)

    rows, kind = _arrays.to_rows(inputs, "input_ids")
    masks = None
    if attention_mask is not None:
        masks, _ = _arrays.to_rows(attention_mask, "attention_mask")
        if len(masks) != len(rows):
            raise ValueError(f"attention_mask has {len(masks)} rows for {len(rows)} rows of input_ids")
    pad = options.get("pad_token_id", model._loaded_defaults.get("pad_token_id"))
    eos = options.get("eos_token_id", model._loaded_defaults.get("eos_token_id"))
    eos_ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    if pad is None:
        pad = eos_ids[0] if eos_ids else 0
    if masks is None and len(rows) > 1 and pad not in eos_ids:
        # As Transformers infers the mask of a batch: positions holding the pad token are padding.
        masks = [[int(t != pad) for t in row] for row in rows]
    prompts = [_real_tokens(r, masks[i] if masks else None) for i, r in enumerate(rows)]

    native_assistant, native_assistant_tokenizer = None, None
    if assistant_model is not None:
        native_assistant = getattr(assistant_model, "_native", None)
        if native_assistant is None:
            raise TypeError("`assistant_model` must be a model loaded by augur's AutoModelForCausalLM")
        same_vocab = model.config.vocab_size == assistant_model.config.vocab_size
        reference = "(see https://huggingface.co/docs/transformers/en/generation_strategies#universal-assisted-decoding)"
        if same_vocab and has_assistant_tokenizer:
            raise ValueError(f"`assistant_tokenizer` is not required when the main and assistant models use the same "
                             f"tokenizer. Please omit `assistant_tokenizer` from `generate()` {reference}.")
        if not same_vocab:
            if tokenizer is None or assistant_tokenizer is None:
                raise ValueError(f"The main and assistant models have different tokenizers. Please provide "
                                 f"`tokenizer` and `assistant_tokenizer` to `generate()` {reference}.")
            native_assistant_tokenizer = assistant_tokenizer._native
    elif has_assistant_tokenizer:
        raise ValueError("`assistant_tokenizer` needs an `assistant_model`")

    on_tokens = None
    if streamer is not None:
        if len(rows) != 1:
            raise ValueError("TextStreamer only supports batch size 1")
        streamer.put(list(rows[0]) if kind is None else _arrays.from_rows([rows[0]], kind))
        on_tokens = streamer.put
    try:
        assistant_options = "{}" if assistant_model is None else json.dumps(
            engine_options(GenerationConfig(**_edits(assistant_model)), {}))
        results = model._native.generate(prompts, json.dumps(options), native_assistant, assistant_options,
                                         native_assistant_tokenizer, on_tokens)
    finally:
        if streamer is not None:
            streamer.end()

    longest = max((len(new) for new, _, _ in results), default=0)
    sequences = [row + new + [pad] * (longest - len(new)) for row, (new, _, _) in zip(rows, results)]
    sequences = _arrays.from_rows(sequences, kind)
    if not return_dict:
        return sequences
    stats = []
    for new, finish, raw in results:
        s = json.loads(raw)
        s["tokens_per_target_forward"] = s.pop("mean_accepted_per_forward")
        s["finish_reason"] = finish
        stats.append(s)
    return GenerateDecoderOnlyOutput(sequences=sequences, stats=stats, scores=None, logits=None)
