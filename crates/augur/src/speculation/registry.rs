//! What a speculation method is to the rest of augur: a [`Method`] entry with its name, its [`Knob`]s, when the
//! options choose it, its validation and how its drafter is built. Each method's file holds its entry and
//! [`REGISTRY`] (in `methods/`, beside the module lines) lists them, one line each, in Transformers' precedence
//! order. Every list of names or knobs elsewhere (the method names in errors, the server's bounds, the CLI's
//! flags test, the Python package's option names) is read from, or tested against, the registry.

use std::sync::LazyLock;

use super::drafter::Drafter;
use super::factory::DraftParts;
use super::method::{Available, SpeculationMethod};
pub use super::methods::REGISTRY;
use crate::error::Result;
use crate::generation::config::{GenerationConfig, GenerationOptions, MAX_DRAFT_VOCAB_SIZE, MAX_MATCHING_NGRAM_SIZE};
use crate::models::ModelConfig;

/// The registry's names, comma-separated, as errors and `bench --methods` list them.
pub static METHODS: LazyLock<String> = LazyLock::new(|| REGISTRY.iter().map(|m| m.name).collect::<Vec<_>>().join(", "));

/// The most draft tokens a request may ask for per round: beyond it a round's forward only grows (the target
/// checks every draft) without more being accepted.
pub const MAX_DRAFT_TOKENS: usize = 128;
/// Branches of a tree draft (`speculative_eagle_topk`).
pub const MAX_TREE_BRANCHES: usize = 16;
/// The most tokens universal assisted decoding may re-tokenize per round.
pub const MAX_LOOKBEHIND: usize = 1024;
/// The deepest suffix match plus draft: each matched token costs a comparison per occurrence and round.
pub const MAX_SUFFIX_DEPTH: usize = 128;

/// Builds a method's drafter for the resolved `method`, from the call's `cfg`, the prompt length, the target's
/// model config and what the pipeline lends.
pub type Build = for<'a> fn(
    SpeculationMethod,
    &GenerationConfig,
    usize,
    &ModelConfig,
    DraftParts<'a>,
) -> Result<Box<dyn Drafter + 'a>>;

/// One speculation method as callers name it.
pub struct Method {
    /// As users type it (`speculation.method`, `bench --methods`).
    pub name: &'static str,
    /// The options it reads, in groups (its own, then those it shares); a named method reads these and no others.
    pub knobs: &'static [&'static [&'static Knob]],
    /// Whether the options (or the loaded models) ask for it when no method is named.
    pub chosen: fn(&GenerationConfig, &Available<'_>) -> bool,
    /// What naming the method implies for its own options (a default, a switch), or what it misses.
    pub named: fn(&mut GenerationOptions) -> Result<()>,
    /// Checks the call against the method and the loaded models, and says which drafter runs.
    pub resolve: fn(&GenerationConfig, &Available<'_>) -> Result<SpeculationMethod>,
    pub build: Build,
}

impl Method {
    /// The method's knobs, each group in turn.
    pub fn each_knob(&self) -> impl Iterator<Item = &'static Knob> {
        self.knobs.iter().flat_map(|group| group.iter().copied())
    }

    /// The speculation fields of `o` that this method reads, and nothing else.
    pub fn own_options(&self, o: &GenerationOptions) -> Result<GenerationOptions> {
        let mut own = GenerationOptions::default();
        for knob in self.each_knob() {
            (knob.copy)(o, &mut own);
        }
        (self.named)(&mut own)?;
        Ok(own)
    }
}

/// One speculation option, under the name Transformers (or vLLM and SGLang, or augur) gives it; the name is the
/// [`GenerationOptions`] field's, so a knob without a field does not compile.
pub struct Knob {
    pub name: &'static str,
    /// What it does, in one line.
    pub doc: &'static str,
    /// The effective value when unset.
    pub default: &'static str,
    /// The most a request may ask for, for counts: beyond it a round only grows.
    pub max: Option<usize>,
    /// The value set in the options, for counts (`None`: unset, or not a count).
    pub count: fn(&GenerationOptions) -> Option<usize>,
    /// Copies the knob's value (set or not) from the first options to the second.
    pub copy: fn(&GenerationOptions, &mut GenerationOptions),
}

impl Knob {
    /// Every knob of every method, each once, in registry order.
    pub fn all() -> Vec<&'static Knob> {
        let mut all: Vec<&'static Knob> = Vec::new();
        for knob in REGISTRY.iter().flat_map(Method::each_knob) {
            if !all.iter().any(|k| k.name == knob.name) {
                all.push(knob);
            }
        }
        all
    }
}

/// A [`Knob`] on the [`GenerationOptions`] field of the same name; `max` marks a count with its bound.
macro_rules! knob {
    ($field:ident, $default:expr, $doc:expr) => {
        Knob {
            name: stringify!($field),
            doc: $doc,
            default: $default,
            max: None,
            count: |_| None,
            copy: |from, to| to.$field = from.$field.clone(),
        }
    };
    ($field:ident, $default:expr, $doc:expr, max $max:expr) => {
        Knob {
            name: stringify!($field),
            doc: $doc,
            default: $default,
            max: $max,
            count: |o| o.$field,
            copy: |from, to| to.$field = from.$field,
        }
    };
}

pub const NUM_ASSISTANT_TOKENS: Knob =
    knob!(num_assistant_tokens, "20", "most tokens a model drafter proposes per round", max Some(MAX_DRAFT_TOKENS));
pub const NUM_ASSISTANT_TOKENS_SCHEDULE: Knob = knob!(
    num_assistant_tokens_schedule,
    "constant",
    "how the draft length changes between rounds: constant, heuristic or heuristic_transient"
);
pub const ASSISTANT_CONFIDENCE_THRESHOLD: Knob = knob!(
    assistant_confidence_threshold,
    "0.4",
    "a model drafter ends its round after a draft less probable than this (0: never)"
);
pub const ASSISTANT_CONFIDENCE_ADAPTIVE: Knob =
    knob!(assistant_confidence_adaptive, "true", "adapt the confidence threshold after every round (ROC rule)");
pub const ASSISTANT_ENSEMBLE_WEIGHT: Knob = knob!(
    assistant_ensemble_weight,
    "unset",
    "lossy ensemble verification against w·p_target + (1−w)·q_draft, 0 < w < 1"
);
pub const COST_AWARE_DRAFTING: Knob = knob!(
    cost_aware_drafting,
    "true",
    "cap drafts by their measured cost and back off where drafting does not pay; false: Transformers' rounds"
);
pub const SPECULATIVE_EAGLE_TOPK: Knob = knob!(
    speculative_eagle_topk,
    "1",
    "tree drafts: above 1, branches per tree, verified in one forward",
    max Some(MAX_TREE_BRANCHES)
);
pub const SPECULATIVE_NUM_DRAFT_TOKENS: Knob =
    knob!(speculative_num_draft_tokens, "16", "tree drafts: most nodes per tree", max Some(MAX_DRAFT_TOKENS));
pub const SPECULATIVE_NUM_STEPS: Knob = knob!(
    speculative_num_steps,
    "the method's draft length",
    "tree drafts: the deepest path",
    max Some(MAX_DRAFT_TOKENS)
);
pub const PROMPT_LOOKUP_NUM_TOKENS: Knob = knob!(
    prompt_lookup_num_tokens,
    "10 when the method is named",
    "tokens copied per round from an earlier n-gram match",
    max Some(MAX_DRAFT_TOKENS)
);
pub const MAX_MATCHING_NGRAM: Knob = knob!(
    max_matching_ngram_size,
    "2",
    "the longest n-gram prompt lookup matches against earlier tokens",
    max Some(MAX_MATCHING_NGRAM_SIZE)
);
pub const ASSISTANT_EARLY_EXIT: Knob =
    knob!(assistant_early_exit, "unset", "the target's first L layers draft (LayerSkip)", max None);
pub const USE_MTP: Knob = knob!(use_mtp, "false", "draft with the checkpoint's multi-token-prediction layers");
pub const ASSISTANT_LOOKBEHIND: Knob = knob!(
    assistant_lookbehind,
    "10",
    "universal assisted decoding: assistant tokens re-decoded per round",
    max Some(MAX_LOOKBEHIND)
);
pub const TARGET_LOOKBEHIND: Knob = knob!(
    target_lookbehind,
    "10",
    "universal assisted decoding: target tokens re-encoded per round",
    max Some(MAX_LOOKBEHIND)
);
pub const DRAFT_VOCAB_SIZE: Knob = knob!(
    draft_vocab_size,
    "32768 above 131072 tokens under cost-aware drafting, else the whole head",
    "the assistant drafts from its LM head over this many of the most frequent tokens, the prompt's and EOS (0: all)",
    max Some(MAX_DRAFT_VOCAB_SIZE)
);

pub const SUFFIX_MAX_DEPTH: Knob = knob!(
    suffix_max_depth,
    "24",
    "suffix decoding: the deepest match plus draft",
    max Some(MAX_SUFFIX_DEPTH)
);
pub const SUFFIX_MAX_SPEC_FACTOR: Knob =
    knob!(suffix_max_spec_factor, "1.0", "suffix decoding: draft tokens allowed per matched token");
pub const SUFFIX_MIN_TOKEN_PROB: Knob =
    knob!(suffix_min_token_prob, "0.1", "suffix decoding: drafts less probable than this are not proposed");
pub const SUFFIX_GLOBAL_CACHE: Knob = knob!(
    suffix_global_cache,
    "true",
    "suffix decoding: read and feed the process-wide cache of earlier outputs (per API key)"
);

/// What suffix decoding reads.
pub const SUFFIX: [&Knob; 4] =
    [&SUFFIX_MAX_DEPTH, &SUFFIX_MAX_SPEC_FACTOR, &SUFFIX_MIN_TOKEN_PROB, &SUFFIX_GLOBAL_CACHE];

/// What a method drafting with a model reads: the draft length and its schedule, the confidence threshold,
/// ensemble verification and cost-aware drafting.
pub const MODEL_DRAFTER: [&Knob; 6] = [
    &NUM_ASSISTANT_TOKENS,
    &NUM_ASSISTANT_TOKENS_SCHEDULE,
    &ASSISTANT_CONFIDENCE_THRESHOLD,
    &ASSISTANT_CONFIDENCE_ADAPTIVE,
    &ASSISTANT_ENSEMBLE_WEIGHT,
    &COST_AWARE_DRAFTING,
];

/// What a method drafting trees reads.
pub const TREE: [&Knob; 3] = [&SPECULATIVE_EAGLE_TOPK, &SPECULATIVE_NUM_DRAFT_TOKENS, &SPECULATIVE_NUM_STEPS];

/// The registry entry named `name`.
pub fn find(name: &str) -> Option<&'static Method> {
    REGISTRY.iter().find(|m| m.name == name)
}

/// The index of the method named `name`, at compile time: a name missing from the registry does not compile.
pub(crate) const fn index_of(name: &str) -> usize {
    let mut i = 0;
    while i < REGISTRY.len() {
        if bytes_eq(REGISTRY[i].name.as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("no speculation method of that name in the registry")
}

const fn bytes_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_a_knob_is_one_knob_in_every_method() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|m| m.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len());
        // Two knobs of one name must be one knob: its bounds and default cannot differ between methods.
        for a in REGISTRY.iter().flat_map(Method::each_knob) {
            let b = Knob::all().into_iter().find(|k| k.name == a.name).unwrap();
            assert!(std::ptr::eq(a, b) || (a.max, a.default, a.doc) == (b.max, b.default, b.doc), "{}", a.name);
        }
    }

    /// The Python package checks option names itself (before the engine sees them): each knob must be there.
    #[test]
    fn the_python_package_takes_every_knob_under_its_name() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../augur-python/python/augur/generation.py");
        let text = std::fs::read_to_string(&path).unwrap();
        let start = text.find("ENGINE_OPTIONS = (").unwrap();
        let options = &text[start..start + text[start..].find("\n)").unwrap()];
        for knob in Knob::all() {
            assert!(options.contains(&format!("\"{}\"", knob.name)), "ENGINE_OPTIONS lacks `{}`", knob.name);
        }
    }
}
