//! Generation options with Transformers 5.24's names, effective defaults and validation errors.
//!
//! Precedence follows `GenerationMixin._prepare_generation_config`: a call's explicit options override the model's
//! `generation_config.json`, which overrides the global defaults (`GenerationConfig._get_default_generation_params`).
//! [`GenerationOptions`] holds "what was explicitly set" (every field optional); [`GenerationConfig`] holds the
//! resolved values.
//!
//! Deliberate deviations from Transformers:
//! - `seed` is not a `GenerationConfig` field there (Transformers seeds torch globally); here it seeds the sampler.
//! - The processor-argument errors (temperature, top_p, min_p, repetition penalty) are raised by Transformers when it
//!   builds the processors at `generate()` time; [`GenerationConfig::validate`] raises them up front, with the same
//!   conditions and wording. Python type checks (`isinstance(temperature, float)`) are not replicated: `1` and `1.0`
//!   are the same temperature here.
//! - Negative token ids (`pad_token_id: -1` in some old configs) are dropped instead of warned about.
//! - Negative `top_k` and other non-representable values are rejected when parsing ([`Error::Config`]), since the
//!   fields are unsigned.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// New tokens generated when neither `max_new_tokens` nor `max_length` is set (Transformers' default `max_length` 20
/// is added to the prompt length in that case).
pub const DEFAULT_MAX_NEW_TOKENS: usize = 20;
pub const DEFAULT_NUM_ASSISTANT_TOKENS: usize = 20;
/// Nodes of a tree draft when `speculative_num_draft_tokens` is unset: a 16-row forward of the 1.5B costs
/// little more than an 8-row one on 2 cores (BENCHMARKS.md, the k curve).
pub const DEFAULT_TREE_NODES: usize = 16;
pub const DEFAULT_ASSISTANT_CONFIDENCE_THRESHOLD: f32 = 0.4;
pub const DEFAULT_MAX_MATCHING_NGRAM_SIZE: usize = 2;
pub const DEFAULT_LOOKBEHIND: usize = 10;

/// `sequence_bias`: token sequences, each with the bias added to its last token (see the field).
pub type SequenceBias = Vec<(Vec<u32>, f32)>;

/// How the assistant's draft length changes between rounds (`num_assistant_tokens_schedule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AssistantTokensSchedule {
    /// Draft length fixed at `num_assistant_tokens`.
    Constant,
    /// +2 when every draft was accepted, else −1 (floor 1); written back to the assistant's config after the call.
    Heuristic,
    /// Same update as `Heuristic`, not written back.
    HeuristicTransient,
}

impl AssistantTokensSchedule {
    /// The three names; Transformers does not validate the string (anything but the two heuristics behaves like
    /// "constant"), [`GenerationConfig::validate`] refuses a misspelt one instead of running it as "constant".
    pub const NAMES: [&'static str; 3] = ["constant", "heuristic", "heuristic_transient"];

    pub fn from_name(name: &str) -> Self {
        match name {
            "heuristic" => AssistantTokensSchedule::Heuristic,
            "heuristic_transient" => AssistantTokensSchedule::HeuristicTransient,
            _ => AssistantTokensSchedule::Constant,
        }
    }
}

/// How large a tree draft may grow (`speculative_eagle_topk`, `speculative_num_draft_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeShape {
    /// Branches: distinct continuations per tree (prompt lookup), children of a low-confidence node and nodes
    /// expanded per depth (a model drafter).
    pub branches: usize,
    /// Nodes per tree.
    pub nodes: usize,
}

/// The largest n-gram prompt lookup may be asked to match (beyond it a round only searches longer).
pub const MAX_MATCHING_NGRAM_SIZE: usize = 32;
/// The largest `draft_vocab_size`: above every vocabulary augur loads (Gemma's 262,144), where it means the
/// whole head.
pub const MAX_DRAFT_VOCAB_SIZE: usize = 1 << 20;

// Each field is declared once; the macro derives the resolved config, the all-optional overrides, JSON parsing and
// merging from the same list so they cannot drift apart. `plain` fields always have a value (the default when
// unset); `opt` fields stay `None` when unset. `parse` turns one JSON value into `Some(value)` (or `None` to ignore).
macro_rules! field_ty {
    (plain, $t:ty) => { $t };
    (opt, $t:ty) => { Option<$t> };
}
macro_rules! field_default {
    (plain, $d:expr) => {
        $d
    };
    (opt, $d:expr) => {
        None
    };
}
macro_rules! field_set {
    (plain, $dst:expr, $v:expr) => {
        $dst = $v
    };
    (opt, $dst:expr, $v:expr) => {
        $dst = Some($v)
    };
}

macro_rules! generation_fields {
    ($( $(#[$doc:meta])* $name:ident : $kind:ident $ty:ty = $default:expr, $parse:expr; )*) => {
        /// Resolved generation options (Transformers' `GenerationConfig` after defaults are filled in).
        #[derive(Debug, Clone, PartialEq, Serialize)]
        pub struct GenerationConfig {
            $( $(#[$doc])* pub $name: field_ty!($kind, $ty), )*
        }

        impl Default for GenerationConfig {
            fn default() -> Self {
                GenerationConfig { $( $name: field_default!($kind, $default), )* }
            }
        }

        /// Explicitly set generation options: a `generation_config.json`, or a call's arguments. `None` = not set.
        #[derive(Debug, Clone, Default, PartialEq, Serialize)]
        pub struct GenerationOptions {
            $( #[serde(skip_serializing_if = "Option::is_none")] pub $name: Option<$ty>, )*
        }

        impl GenerationOptions {
            /// Reads the known fields of a JSON object; unknown fields are ignored, `null` means "not set".
            pub fn from_json_map(map: &Map<String, Value>) -> Result<Self> {
                let mut out = GenerationOptions::default();
                $(
                    if let Some(v) = map.get(stringify!($name)).filter(|v| !v.is_null()) {
                        out.$name = ($parse)(stringify!($name), v)?;
                    }
                )*
                Ok(out)
            }

            /// Overrides `self` with every field set in `other` (`other` wins).
            pub fn merge(&mut self, other: &GenerationOptions) {
                $( if other.$name.is_some() { self.$name = other.$name.clone(); } )*
            }
        }

        impl GenerationConfig {
            /// Overrides the fields that `options` sets, leaving the others as they are.
            pub fn apply(&mut self, options: &GenerationOptions) {
                $( if let Some(v) = &options.$name { field_set!($kind, self.$name, v.clone()); } )*
            }
        }
    };
}

generation_fields! {
    /// Maximum number of new tokens; takes precedence over `max_length`.
    max_new_tokens: opt usize = (), parse_de::<usize>;
    /// Maximum total length, prompt included (Transformers' `max_length`). When neither this nor `max_new_tokens`
    /// is set, 20 new tokens (capped by the model's `max_position_embeddings`).
    max_length: opt usize = (), parse_de::<usize>;
    /// Minimum number of new tokens before EOS may be generated; takes precedence over `min_length`.
    min_new_tokens: opt usize = (), parse_de::<usize>;
    /// Minimum total length, prompt included, before EOS may be generated.
    min_length: opt usize = (), parse_de::<usize>;
    /// Sample from the processed distribution instead of taking the argmax.
    do_sample: plain bool = false, parse_de::<bool>;
    temperature: plain f32 = 1.0, parse_de::<f32>;
    /// 0 disables top-k.
    top_k: plain usize = 50, parse_de::<usize>;
    top_p: plain f32 = 1.0, parse_de::<f32>;
    min_p: opt f32 = (), parse_de::<f32>;
    repetition_penalty: plain f32 = 1.0, parse_de::<f32>;
    /// Additive biases on token sequences, as Transformers' `sequence_bias` in its list form
    /// `[[[ids…], bias], …]`: a one-token sequence's bias always applies to that token; a longer one's applies to
    /// its last token when the context ends with the rest. A repeated sequence keeps its last bias. OpenAI's
    /// `logit_bias` is the one-token case.
    sequence_bias: plain SequenceBias = Vec::new(), parse_sequence_bias;
    /// Seed of the sampler; `None` seeds from the OS. Not a Transformers field (it seeds torch globally).
    seed: opt u64 = (), parse_de::<u64>;
    /// Each position draws from its own random stream, keyed by (seed, position), and speculative verification
    /// keeps a draft only where it equals the target's own draw at its position (llama.cpp's verification): a
    /// seeded text is then the same whichever rounds drafted (alone, under load, with or without back-off or
    /// speculation), still exactly the target's distribution, at a lower acceptance than speculative sampling's
    /// for sampled drafts. Not a Transformers field; the server sets it for seeded requests.
    sample_by_position: plain bool = false, parse_de::<bool>;
    /// End-of-sequence token ids; JSON accepts one id or a list. Empty: generation stops only on length.
    eos_token_id: plain Vec<u32> = Vec::new(), parse_token_ids;
    pad_token_id: opt u32 = (), parse_token_id;
    bos_token_id: opt u32 = (), parse_token_id;
    /// Strings that end generation once the generated text ends with one of them; JSON accepts a string or a list.
    stop_strings: plain Vec<String> = Vec::new(), parse_strings;
    /// Maximum draft length per round for model drafters (effective default 20).
    num_assistant_tokens: opt usize = (), parse_de::<usize>;
    /// "constant" (effective default), "heuristic" or "heuristic_transient"; see [`AssistantTokensSchedule`].
    num_assistant_tokens_schedule: opt String = (), parse_de::<String>;
    /// The assistant stops drafting when its drafted token's probability is below this (effective default 0.4;
    /// 0 disables).
    assistant_confidence_threshold: opt f32 = (), parse_de::<f32>;
    /// Adapt the confidence threshold by the ROC rule after every round (default true: Transformers does it
    /// when scikit-learn is installed; false gives its behaviour without scikit-learn). Not a Transformers field.
    assistant_confidence_adaptive: opt bool = (), parse_de::<bool>;
    /// Measure what drafting costs and saves, and draft less or not at all where it does not pay (see
    /// `speculation::cost_model`). Not a Transformers field; false gives Transformers' round structure. Off
    /// under `assistant_ensemble_weight` whatever its value (see [`GenerationConfig::cost_aware`]).
    cost_aware_drafting: plain bool = true, parse_de::<bool>;
    /// Enables prompt lookup decoding: maximum continuation length copied from an n-gram match.
    prompt_lookup_num_tokens: opt usize = (), parse_de::<usize>;
    /// Largest n-gram tried first by prompt lookup (effective default 2; 0 also means 2, as `0 or 2` in Python).
    max_matching_ngram_size: opt usize = (), parse_de::<usize>;
    /// Enables early-exit self-speculation: number of layers the self-drafter runs.
    assistant_early_exit: opt usize = (), parse_de::<usize>;
    /// Static ensemble verification weight `w` in (0, 1): accept against `w·p + (1−w)·q`. `None`: lossless.
    assistant_ensemble_weight: opt f32 = (), parse_de::<f32>;
    /// Multi-token-prediction self-drafting with the model's MTP layers.
    use_mtp: plain bool = false, parse_de::<bool>;
    /// Tree drafting (vLLM's and SGLang's `speculative_eagle_topk`): above 1, prompt lookup proposes the
    /// continuations of up to this many distinct matches as one tree, and an assistant model branches into its
    /// this many top tokens where its confidence is low, expanding this many paths per depth. 1 or unset: one
    /// chain per round, as Transformers.
    speculative_eagle_topk: opt usize = (), parse_de::<usize>;
    /// Tree drafting: most nodes in one tree, i.e. draft rows in one verification (vLLM's and SGLang's
    /// `speculative_num_draft_tokens`; effective default 16).
    speculative_num_draft_tokens: opt usize = (), parse_de::<usize>;
    /// Tree drafting: the deepest path (SGLang's `speculative_num_steps`); unset: the method's draft length
    /// (`num_assistant_tokens`, `prompt_lookup_num_tokens`).
    speculative_num_steps: opt usize = (), parse_de::<usize>;
    /// Universal assisted decoding: previous assistant tokens re-decoded when mapping drafts (effective 10).
    assistant_lookbehind: opt usize = (), parse_de::<usize>;
    /// Universal assisted decoding: previous target tokens re-encoded for the assistant (effective 10).
    target_lookbehind: opt usize = (), parse_de::<usize>;
    /// Suffix decoding: the deepest match plus draft (vLLM's `suffix_decoding_max_tree_depth`; effective 24).
    suffix_max_depth: opt usize = (), parse_de::<usize>;
    /// Suffix decoding: draft tokens allowed per matched token (effective 1.0).
    suffix_max_spec_factor: opt f32 = (), parse_de::<f32>;
    /// Suffix decoding: drafts whose estimated probability is below this are not proposed (effective 0.1).
    suffix_min_token_prob: opt f32 = (), parse_de::<f32>;
    /// Suffix decoding: read and feed the process-wide cache of earlier outputs (effective true); false keeps to
    /// the request's own prompt and output.
    suffix_global_cache: opt bool = (), parse_de::<bool>;
    /// The assistant drafts from a reduced vocabulary (EAGLE-3's `draft_vocab_size`, FR-Spec): its LM head over
    /// this many of the most frequent tokens, plus the prompt's tokens and EOS. 0, or the vocabulary's size or
    /// more: the whole head. Unset: [`crate::speculation::draft_vocab::DEFAULT_DRAFT_VOCAB_SIZE`] for large
    /// vocabularies under cost-aware drafting, else the whole head. Not a Transformers field.
    draft_vocab_size: opt usize = (), parse_de::<usize>;
}

fn parse_de<T: DeserializeOwned>(field: &str, v: &Value) -> Result<Option<T>> {
    T::deserialize(v).map(Some).map_err(|e| Error::config(field, e.to_string()))
}

/// One id; negative ids mean "none" (some configs use -1), as Transformers only warns about them.
fn parse_token_id(field: &str, v: &Value) -> Result<Option<u32>> {
    match v.as_i64() {
        Some(n) if n < 0 => Ok(None),
        Some(n) => {
            u32::try_from(n).map(Some).map_err(|_| Error::config(field, format!("token id {n} is out of range")))
        }
        None => Err(Error::config(field, format!("expected a token id, got {v}"))),
    }
}

/// One id or a list of ids; negative ids are dropped.
fn parse_token_ids(field: &str, v: &Value) -> Result<Option<Vec<u32>>> {
    let items: Vec<&Value> = match v {
        Value::Array(a) => a.iter().collect(),
        _ => vec![v],
    };
    let mut ids = Vec::with_capacity(items.len());
    for item in items {
        let id = parse_token_id(field, item)
            .map_err(|_| Error::config(field, format!("expected a token id or a list of token ids, got {v}")))?;
        if let Some(id) = id {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(Some(ids))
}

/// `[[[ids…], bias], …]`, with Transformers' error for any other shape; a repeated sequence keeps its last bias
/// (Transformers turns the list into a dict keyed by the sequence).
fn parse_sequence_bias(field: &str, v: &Value) -> Result<Option<SequenceBias>> {
    let bad = || {
        Error::config(
            field,
            format!(
                "Each element in `sequence_bias` has to be a non-empty list of lists of positive integers and float, \
                 but is {v}."
            ),
        )
    };
    let Value::Array(items) = v else {
        return Err(Error::config(
            field,
            format!("`sequence_bias` has to be a non-empty dictionary, or non-empty list of lists but is {v}."),
        ));
    };
    let mut out: SequenceBias = Vec::with_capacity(items.len());
    for item in items {
        let (ids, bias) = match item.as_array().map(Vec::as_slice) {
            Some([Value::Array(ids), bias]) if !ids.is_empty() => (ids, bias.as_f64().ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        let ids = ids
            .iter()
            .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(bad))
            .collect::<Result<Vec<u32>>>()?;
        match out.iter_mut().find(|(seq, _)| *seq == ids) {
            Some(entry) => entry.1 = bias as f32,
            None => out.push((ids, bias as f32)),
        }
    }
    Ok(Some(out))
}

/// One string or a list of strings (Transformers accepts both for `stop_strings`).
fn parse_strings(field: &str, v: &Value) -> Result<Option<Vec<String>>> {
    match v {
        Value::String(s) => Ok(Some(vec![s.clone()])),
        _ => parse_de::<Vec<String>>(field, v)
            .map_err(|_| Error::config(field, format!("expected a string or a list of strings, got {v}"))),
    }
}

impl<'de> Deserialize<'de> for GenerationOptions {
    /// Same rules as [`GenerationOptions::from_json_map`], so a request body parses like `generation_config.json`.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        GenerationOptions::from_json_map(&map).map_err(serde::de::Error::custom)
    }
}

impl GenerationOptions {
    pub fn from_json_str(text: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| Error::config("generation_config.json", e.to_string()))?;
        match value {
            Value::Object(map) => GenerationOptions::from_json_map(&map),
            _ => Err(Error::config("generation_config.json", "expected a JSON object")),
        }
    }

    /// Reads a model's `generation_config.json`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        GenerationOptions::from_json_str(&text).map_err(|e| match e {
            Error::Config { field, reason } => {
                Error::Config { field, reason: format!("{reason} (in {})", path.display()) }
            }
            other => other,
        })
    }
}

impl GenerationConfig {
    /// Global defaults overridden by `options`.
    pub fn from_options(options: &GenerationOptions) -> Self {
        let mut config = GenerationConfig::default();
        config.apply(options);
        config
    }

    /// Global defaults overridden by a model's `generation_config.json`.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self> {
        Ok(GenerationConfig::from_options(&GenerationOptions::from_json_file(path)?))
    }

    /// A copy of `self` (e.g. the model's defaults) with a call's explicit options applied on top.
    pub fn with_options(&self, options: &GenerationOptions) -> Self {
        let mut config = self.clone();
        config.apply(options);
        config
    }

    /// Raises the errors Transformers 5.24 raises for these options before decoding starts (`validate`, processor
    /// constructors, `_get_candidate_generator`, `PromptLookupCandidateGenerator`), with its wording. Checks follow
    /// Transformers' conditions exactly: e.g. sampling-only values are not checked when `do_sample` is false, and a
    /// `top_p` above 1 is accepted (Transformers then skips top-p).
    pub fn validate(&self) -> Result<()> {
        let err = |msg: String| Err(Error::InvalidOption(msg));
        for (name, v) in [
            ("speculative_eagle_topk", self.speculative_eagle_topk),
            ("speculative_num_draft_tokens", self.speculative_num_draft_tokens),
            ("speculative_num_steps", self.speculative_num_steps),
        ] {
            if v == Some(0) {
                return err(format!("`{name}` must be at least 1, but is 0."));
            }
        }
        if let Some(n) = self.draft_vocab_size.filter(|&n| n > MAX_DRAFT_VOCAB_SIZE) {
            return err(format!("`draft_vocab_size` must be at most {MAX_DRAFT_VOCAB_SIZE}, but is {n}."));
        }
        // Prompt lookup tries every n-gram size from this one down, over the whole context, every round.
        if let Some(n) = self.max_matching_ngram_size.filter(|&n| n > MAX_MATCHING_NGRAM_SIZE) {
            return err(format!("`max_matching_ngram_size` must be at most {MAX_MATCHING_NGRAM_SIZE}, but is {n}."));
        }
        if self.tree_shape().is_some() && self.assistant_ensemble_weight.is_some() {
            return err("`assistant_ensemble_weight` verifies one chain of drafts; it cannot be combined with tree \
                        drafts (`speculative_eagle_topk` above 1)."
                .to_string());
        }
        if let Some(n) = self.max_new_tokens {
            if n == 0 {
                return err(format!("`max_new_tokens` must be greater than 0, but is {n}."));
            }
        }
        if let Some(name) = self.num_assistant_tokens_schedule.as_deref() {
            if !AssistantTokensSchedule::NAMES.contains(&name) {
                return err(format!(
                    "`num_assistant_tokens_schedule` must be one of {:?}, but is {name:?}",
                    AssistantTokensSchedule::NAMES
                ));
            }
        }
        if let Some(w) = self.assistant_ensemble_weight {
            if !(0.0 < w && w < 1.0) {
                return err(format!(
                    "`assistant_ensemble_weight` must be in the open interval `(0.0, 1.0)`, but is {}. Use `None` for \
                     standard (lossless) speculative decoding.",
                    py_float(w)
                ));
            }
        }
        // Not a Transformers check: an empty stop string would end every generation after its first token.
        if self.stop_strings.iter().any(String::is_empty) {
            return err("`stop_strings` must not contain an empty string".to_string());
        }
        let rp = self.repetition_penalty;
        if rp != 1.0 && !strictly_positive(rp) {
            return err(format!("`penalty` has to be a strictly positive float, but is {}", py_float(rp)));
        }
        if self.do_sample {
            let t = self.temperature;
            if t != 1.0 && !strictly_positive(t) {
                let mut msg = format!(
                    "`temperature` (={}) has to be a strictly positive float, otherwise your next token scores will be \
                     invalid.",
                    py_float(t)
                );
                if t == 0.0 {
                    msg.push_str(" If you're looking for greedy decoding strategies, set `do_sample=False`.");
                }
                return err(msg);
            }
            let p = self.top_p;
            // Transformers only builds TopP for top_p < 1, then rejects values below 0.
            if p < 0.0 {
                return err(format!("`top_p` has to be a float > 0 and < 1, but is {}", py_float(p)));
            }
            if let Some(m) = self.min_p {
                if !(0.0..=1.0).contains(&m) {
                    return err(format!("`min_p` has to be a float in the [0, 1] interval, but is {}", py_float(m)));
                }
            }
        }
        // Prompt lookup is only built when early exit is not requested (drafter precedence).
        if self.assistant_early_exit.is_none() {
            if let Some(n) = self.prompt_lookup_num_tokens {
                if self.assistant_ensemble_weight.is_some() {
                    return err("Setting `assistant_ensemble_weight` requires candidate logits from the assistant \
                                model. It is not supported with prompt lookup decoding."
                        .to_string());
                }
                if n == 0 {
                    return err("Invalid max_matching_ngram_size or num_output_tokens".to_string());
                }
            }
        }
        Ok(())
    }

    /// Total length limit, prompt included (Transformers' `_prepare_generated_length` for decoder-only models).
    pub fn max_length_for(&self, prompt_len: usize, max_position_embeddings: Option<usize>) -> usize {
        if let Some(n) = self.max_new_tokens {
            return prompt_len.saturating_add(n);
        }
        if let Some(m) = self.max_length {
            return m;
        }
        let default = prompt_len.saturating_add(DEFAULT_MAX_NEW_TOKENS);
        max_position_embeddings.map_or(default, |mpe| default.min(mpe))
    }

    /// How many new tokens may be generated; errors as Transformers does when the prompt already fills `max_length`.
    pub fn max_new_tokens_for(&self, prompt_len: usize, max_position_embeddings: Option<usize>) -> Result<usize> {
        let max_length = self.max_length_for(prompt_len, max_position_embeddings);
        if prompt_len >= max_length {
            return Err(Error::InvalidOption(format!(
                "Input length of input_ids is {prompt_len}, but `max_length` is set to {max_length}. This can lead to \
                 unexpected behavior. You should consider increasing `max_length` or, better yet, setting \
                 `max_new_tokens`."
            )));
        }
        Ok(max_length - prompt_len)
    }

    /// Total length (prompt included) below which EOS is suppressed; 0 when there is no minimum.
    pub fn min_length_for(&self, prompt_len: usize) -> usize {
        match self.min_new_tokens {
            Some(n) => prompt_len.saturating_add(n),
            None => self.min_length.unwrap_or(0),
        }
    }

    pub fn effective_num_assistant_tokens(&self) -> usize {
        match (self.tree_shape(), self.speculative_num_steps) {
            (Some(_), Some(n)) => n,
            _ => self.num_assistant_tokens.unwrap_or(DEFAULT_NUM_ASSISTANT_TOKENS),
        }
    }

    /// The trees drafters propose, `None` for chains (`speculative_eagle_topk` unset or 1).
    pub fn tree_shape(&self) -> Option<TreeShape> {
        self.speculative_eagle_topk.filter(|&k| k > 1).map(|branches| TreeShape {
            branches,
            nodes: self.speculative_num_draft_tokens.unwrap_or(DEFAULT_TREE_NODES),
        })
    }

    pub fn assistant_tokens_schedule(&self) -> AssistantTokensSchedule {
        self.num_assistant_tokens_schedule
            .as_deref()
            .map_or(AssistantTokensSchedule::Constant, AssistantTokensSchedule::from_name)
    }

    pub fn effective_assistant_confidence_threshold(&self) -> f32 {
        self.assistant_confidence_threshold.unwrap_or(DEFAULT_ASSISTANT_CONFIDENCE_THRESHOLD)
    }

    /// `max_matching_ngram_size or 2`: unset and 0 both mean 2.
    pub fn effective_max_matching_ngram_size(&self) -> usize {
        match self.max_matching_ngram_size {
            None | Some(0) => DEFAULT_MAX_MATCHING_NGRAM_SIZE,
            Some(n) => n,
        }
    }

    pub fn effective_assistant_lookbehind(&self) -> usize {
        self.assistant_lookbehind.unwrap_or(DEFAULT_LOOKBEHIND)
    }

    pub fn effective_target_lookbehind(&self) -> usize {
        self.target_lookbehind.unwrap_or(DEFAULT_LOOKBEHIND)
    }

    /// Whether the cost model may shape the rounds: `cost_aware_drafting`, except under ensemble verification.
    /// There a draft position's token follows the mixture ν and a plain step's the target alone, so rounds
    /// chosen from measured seconds would make the output depend on timing.
    pub fn cost_aware(&self) -> bool {
        self.cost_aware_drafting && self.assistant_ensemble_weight.is_none()
    }

    /// Whether `generate()` would run assisted decoding without an assistant model (the self-drafting knobs).
    pub fn uses_self_drafting(&self) -> bool {
        self.assistant_early_exit.is_some() || self.prompt_lookup_num_tokens.is_some() || self.use_mtp
    }
}

/// `x > 0`, false for NaN (Python's `not (x > 0)` rejects NaN too).
fn strictly_positive(x: f32) -> bool {
    x > 0.0
}

/// Formats a float as Python's `repr` does, so error messages match Transformers' f-strings.
pub(crate) fn py_float(x: f32) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    // Rust's Debug is the shortest round-trip form and switches to exponents at the same thresholds as Python
    // (exp < -4 or >= 16); only the exponent spelling differs ("1e-7" vs "1e-07", "1e16" vs "1e+16").
    let s = format!("{x:?}");
    match s.split_once('e') {
        None => s,
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(config: &GenerationConfig) -> String {
        match config.validate() {
            Err(Error::InvalidOption(m)) => m,
            other => panic!("expected InvalidOption, got {other:?}"),
        }
    }

    #[test]
    fn an_empty_stop_string_is_refused() {
        let c = GenerationConfig { stop_strings: vec!["\n".into(), String::new()], ..Default::default() };
        assert_eq!(msg(&c), "`stop_strings` must not contain an empty string");
        let c = GenerationConfig { stop_strings: vec!["\n".into()], ..Default::default() };
        assert!(c.validate().is_ok());
    }

    #[test]
    fn defaults_are_transformers_effective_defaults() {
        let c = GenerationConfig::default();
        assert!(!c.do_sample);
        assert_eq!(c.temperature, 1.0);
        assert_eq!(c.top_k, 50);
        assert_eq!(c.top_p, 1.0);
        assert_eq!(c.min_p, None);
        assert_eq!(c.repetition_penalty, 1.0);
        assert!(c.eos_token_id.is_empty());
        assert_eq!(c.effective_num_assistant_tokens(), 20);
        assert_eq!(c.assistant_tokens_schedule(), AssistantTokensSchedule::Constant);
        assert_eq!(c.effective_assistant_confidence_threshold(), 0.4);
        assert_eq!(c.effective_max_matching_ngram_size(), 2);
        assert_eq!(c.effective_assistant_lookbehind(), 10);
        assert_eq!(c.effective_target_lookbehind(), 10);
        assert!(c.validate().is_ok());
    }

    #[test]
    fn parses_generation_config_with_int_eos_and_ignores_unknown_fields() {
        let o = GenerationOptions::from_json_str(
            r#"{"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": -1,
                "do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": null,
                "transformers_version": "4.45.0", "max_length": 4096}"#,
        )
        .unwrap();
        let c = GenerationConfig::from_options(&o);
        assert_eq!(c.eos_token_id, vec![2]);
        assert_eq!(c.bos_token_id, Some(1));
        assert_eq!(c.pad_token_id, None);
        assert!(c.do_sample);
        assert_eq!(c.temperature, 0.6);
        assert_eq!(c.top_p, 0.9);
        assert_eq!(c.top_k, 50, "null means unset, so the default stays");
        assert_eq!(c.max_length, Some(4096));
    }

    #[test]
    fn parses_list_eos_and_string_stop_strings() {
        let o = GenerationOptions::from_json_str(
            r#"{"eos_token_id": [151645, 151643, 151645], "stop_strings": "END", "repetition_penalty": 1}"#,
        )
        .unwrap();
        assert_eq!(o.eos_token_id, Some(vec![151645, 151643]));
        assert_eq!(o.stop_strings, Some(vec!["END".to_string()]));
        assert_eq!(o.repetition_penalty, Some(1.0));
        let o: GenerationOptions = serde_json::from_str(r#"{"stop_strings": ["a", "b"]}"#).unwrap();
        assert_eq!(o.stop_strings, Some(vec!["a".to_string(), "b".to_string()]));
    }

    #[test]
    fn bad_field_names_the_field() {
        match GenerationOptions::from_json_str(r#"{"top_k": -1}"#) {
            Err(Error::Config { field, .. }) => assert_eq!(field, "top_k"),
            other => panic!("{other:?}"),
        }
        match GenerationOptions::from_json_str(r#"{"eos_token_id": "x"}"#) {
            Err(Error::Config { field, reason }) => {
                assert_eq!(field, "eos_token_id");
                assert!(reason.contains("list of token ids"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(GenerationOptions::from_json_str("[1]"), Err(Error::Config { .. })));
    }

    #[test]
    fn from_json_file_reads_and_reports_missing_files() {
        let dir = std::env::temp_dir().join(format!("augur-genconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("generation_config.json");
        std::fs::write(&path, r#"{"eos_token_id": [1, 2], "max_new_tokens": 7}"#).unwrap();
        let c = GenerationConfig::from_json_file(&path).unwrap();
        assert_eq!(c.eos_token_id, vec![1, 2]);
        assert_eq!(c.max_new_tokens, Some(7));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(GenerationConfig::from_json_file(&path), Err(Error::Io { .. })));
    }

    #[test]
    fn call_options_override_model_defaults() {
        let model = GenerationConfig::from_options(
            &GenerationOptions::from_json_str(r#"{"do_sample": true, "temperature": 0.6, "eos_token_id": [1, 2]}"#)
                .unwrap(),
        );
        let call = GenerationOptions { temperature: Some(1.0), min_p: Some(0.1), ..Default::default() };
        let c = model.with_options(&call);
        assert!(c.do_sample, "kept from the model");
        assert_eq!(c.temperature, 1.0, "overridden by the call");
        assert_eq!(c.min_p, Some(0.1));
        assert_eq!(c.eos_token_id, vec![1, 2]);

        let mut a = GenerationOptions { top_k: Some(5), top_p: Some(0.5), ..Default::default() };
        a.merge(&GenerationOptions { top_k: Some(7), ..Default::default() });
        assert_eq!((a.top_k, a.top_p), (Some(7), Some(0.5)));
    }

    #[test]
    fn length_resolution_follows_transformers() {
        let mut c = GenerationConfig::default();
        assert_eq!(c.max_new_tokens_for(5, None).unwrap(), 20);
        assert_eq!(c.max_new_tokens_for(5, Some(16)).unwrap(), 11, "default capped by max_position_embeddings");
        c.max_length = Some(12);
        assert_eq!(c.max_new_tokens_for(5, Some(8)).unwrap(), 7, "an explicit max_length is total and not capped");
        let e = c.max_new_tokens_for(12, None).unwrap_err().to_string();
        assert_eq!(
            e,
            "Input length of input_ids is 12, but `max_length` is set to 12. This can lead to unexpected behavior. \
             You should consider increasing `max_length` or, better yet, setting `max_new_tokens`."
        );
        c.max_new_tokens = Some(3);
        assert_eq!(c.max_new_tokens_for(100, None).unwrap(), 3, "max_new_tokens wins over max_length");

        assert_eq!(c.min_length_for(10), 0);
        c.min_length = Some(4);
        assert_eq!(c.min_length_for(10), 4);
        c.min_new_tokens = Some(2);
        assert_eq!(c.min_length_for(10), 12);
    }

    #[test]
    fn validation_messages_match_transformers() {
        let base = GenerationConfig::default();

        let c = GenerationConfig { max_new_tokens: Some(0), ..base.clone() };
        assert_eq!(msg(&c), "`max_new_tokens` must be greater than 0, but is 0.");

        for w in [0.0, 1.0, -0.5] {
            let c = GenerationConfig { assistant_ensemble_weight: Some(w), ..base.clone() };
            assert_eq!(
                msg(&c),
                format!(
                    "`assistant_ensemble_weight` must be in the open interval `(0.0, 1.0)`, but is {}. Use `None` \
                     for standard (lossless) speculative decoding.",
                    py_float(w)
                )
            );
        }
        let c = GenerationConfig { assistant_ensemble_weight: Some(1.0), ..base.clone() };
        assert!(msg(&c).contains("but is 1.0."), "Python float repr");
        assert!(GenerationConfig { assistant_ensemble_weight: Some(0.5), ..base.clone() }.validate().is_ok());

        let c = GenerationConfig { repetition_penalty: 0.0, ..base.clone() };
        assert_eq!(msg(&c), "`penalty` has to be a strictly positive float, but is 0.0");

        let c = GenerationConfig { do_sample: true, temperature: 0.0, ..base.clone() };
        assert_eq!(
            msg(&c),
            "`temperature` (=0.0) has to be a strictly positive float, otherwise your next token scores will be \
             invalid. If you're looking for greedy decoding strategies, set `do_sample=False`."
        );
        let c = GenerationConfig { do_sample: true, temperature: -0.5, ..base.clone() };
        assert_eq!(
            msg(&c),
            "`temperature` (=-0.5) has to be a strictly positive float, otherwise your next token scores will be \
             invalid."
        );
        // Greedy: sampling-only values are not checked, as in Transformers (only a warning there).
        assert!(GenerationConfig { temperature: 0.0, top_p: -1.0, min_p: Some(2.0), ..base.clone() }
            .validate()
            .is_ok());

        let c = GenerationConfig { do_sample: true, top_p: -0.1, ..base.clone() };
        assert_eq!(msg(&c), "`top_p` has to be a float > 0 and < 1, but is -0.1");
        assert!(GenerationConfig { do_sample: true, top_p: 0.0, ..base.clone() }.validate().is_ok());
        assert!(GenerationConfig { do_sample: true, top_p: 1.5, ..base.clone() }.validate().is_ok());

        let c = GenerationConfig { do_sample: true, min_p: Some(1.5), ..base.clone() };
        assert_eq!(msg(&c), "`min_p` has to be a float in the [0, 1] interval, but is 1.5");

        let c = GenerationConfig { prompt_lookup_num_tokens: Some(0), ..base.clone() };
        assert_eq!(msg(&c), "Invalid max_matching_ngram_size or num_output_tokens");
        let c =
            GenerationConfig { prompt_lookup_num_tokens: Some(3), max_matching_ngram_size: Some(0), ..base.clone() };
        assert!(c.validate().is_ok(), "`0 or 2` is 2 in Transformers");
        assert_eq!(c.effective_max_matching_ngram_size(), 2);
        let c =
            GenerationConfig { prompt_lookup_num_tokens: Some(3), max_matching_ngram_size: Some(33), ..base.clone() };
        assert_eq!(msg(&c), "`max_matching_ngram_size` must be at most 32, but is 33.");

        let c = GenerationConfig {
            prompt_lookup_num_tokens: Some(3),
            assistant_ensemble_weight: Some(0.5),
            ..base.clone()
        };
        assert_eq!(
            msg(&c),
            "Setting `assistant_ensemble_weight` requires candidate logits from the assistant model. It is not \
             supported with prompt lookup decoding."
        );
        let c = GenerationConfig { assistant_early_exit: Some(4), ..c };
        assert!(c.validate().is_ok(), "early exit takes precedence, so prompt lookup is never built");
    }

    #[test]
    fn schedule_names() {
        let mut c = GenerationConfig::default();
        for (name, s) in [
            ("heuristic", AssistantTokensSchedule::Heuristic),
            ("heuristic_transient", AssistantTokensSchedule::HeuristicTransient),
            ("constant", AssistantTokensSchedule::Constant),
            ("bogus", AssistantTokensSchedule::Constant),
        ] {
            c.num_assistant_tokens_schedule = Some(name.into());
            assert_eq!(c.assistant_tokens_schedule(), s);
        }
    }

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(0.0), "0.0");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.7), "0.7");
        assert_eq!(py_float(-2.5), "-2.5");
        assert_eq!(py_float(1e-7), "1e-07");
        assert_eq!(py_float(1.5e20), "1.5e+20");
        assert_eq!(py_float(f32::NAN), "nan");
        assert_eq!(py_float(f32::NEG_INFINITY), "-inf");
    }
}
