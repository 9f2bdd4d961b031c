//! Which drafter a call runs, decided once per call: named by the caller, or the first method of the registry
//! (Transformers' precedence) that the options choose. Each method's entry raises the errors about its choice,
//! so that the drafter factory only builds and the pipeline only runs.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use super::registry::{Knob, Method, METHODS, REGISTRY};
use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::models::ModelConfig;
use crate::tokenizer::Tokenizer;

pub use super::methods::DEFAULT_PROMPT_LOOKUP_NUM_TOKENS;

/// A method as a caller names it: plain decoding, or an entry of the [`REGISTRY`]. A named method is the one
/// that runs, whatever speculation fields of other methods the options carry (a server's defaults, say).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MethodName(Option<usize>);

/// The methods callers name in code; a name missing from the registry does not compile.
#[allow(non_upper_case_globals)]
impl MethodName {
    /// Plain decoding.
    pub const Plain: MethodName = MethodName(None);
    pub const PromptLookup: MethodName = MethodName::registered("prompt_lookup");
    /// The pipeline's assistant, by the method its architecture and tokenizer allow.
    pub const AssistantModel: MethodName = MethodName::registered("assistant_model");
    pub const EarlyExit: MethodName = MethodName::registered("early_exit");
    pub const Mtp: MethodName = MethodName::registered("mtp");
    pub const Suffix: MethodName = MethodName::registered("suffix");
    /// Suffix decoding or the assistant, or neither, round by round (the CLI's and the server's default).
    pub const Auto: MethodName = MethodName::registered("auto");

    const fn registered(name: &str) -> MethodName {
        MethodName(Some(super::registry::index_of(name)))
    }

    /// The method's registry entry; `None` for plain decoding.
    pub fn method(self) -> Option<&'static Method> {
        self.0.map(|i| &REGISTRY[i])
    }

    pub fn as_str(self) -> &'static str {
        self.method().map_or("plain", |m| m.name)
    }

    /// The speculation fields of `o` that this method reads, and nothing else: a request's or a flag's fields of
    /// other methods can then change neither the drafter nor the verification (an ensemble weight under prompt
    /// lookup, say).
    pub fn own_options(self, o: &GenerationOptions) -> Result<GenerationOptions> {
        self.method().map_or_else(|| Ok(GenerationOptions::default()), |m| m.own_options(o))
    }

    /// `o` with its speculation fields narrowed to [`MethodName::own_options`]; sampling, length and stopping
    /// fields pass unchanged.
    pub fn scope(self, o: &GenerationOptions) -> Result<GenerationOptions> {
        let mut scoped = without_speculation(o);
        scoped.merge(&self.own_options(o)?);
        Ok(scoped)
    }
}

/// `o` without any speculation field (any method's knob).
pub fn without_speculation(o: &GenerationOptions) -> GenerationOptions {
    let (mut out, unset) = (o.clone(), GenerationOptions::default());
    for knob in Knob::all() {
        (knob.copy)(&unset, &mut out);
    }
    out
}

impl FromStr for MethodName {
    type Err = Error;

    /// One of [`METHODS`]; plain decoding has a name of its own in each caller (`off`, `plain`).
    fn from_str(name: &str) -> Result<Self> {
        match REGISTRY.iter().position(|m| m.name == name) {
            Some(i) => Ok(MethodName(Some(i))),
            None => Err(Error::InvalidOption(format!("method `{name}` is unknown (expected {})", *METHODS))),
        }
    }
}

impl fmt::Display for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for MethodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The drafter a call runs, with what the options decided for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeculationMethod {
    /// Plain decoding.
    None,
    /// The target's first `layers` layers draft (LayerSkip).
    EarlyExit {
        layers: usize,
    },
    PromptLookup {
        num_tokens: usize,
        max_matching_ngram_size: usize,
    },
    /// The checkpoint's multi-token-prediction layers draft.
    Mtp,
    /// An assistant with the target's tokenizer drafts target ids.
    Assistant,
    /// Gemma 4's assistant, recognised by its architecture as Transformers picks its generator by class name.
    Gemma4Assistant,
    /// An assistant with another tokenizer, greedy: drafts are translated through text.
    Universal,
    /// An assistant with another tokenizer, sampled: drafts map through the tokens both vocabularies share.
    UniversalSampling,
    /// Suffix decoding and, when `assistant`, the assistant (same tokenizer), chosen round by round.
    Auto {
        assistant: bool,
    },
    /// A method whose registry entry builds its drafter from the options alone.
    Registered(MethodName),
}

/// What resolution reads of a loaded model.
#[derive(Clone, Copy)]
pub struct LoadedModel<'a> {
    pub path: &'a Path,
    pub config: &'a ModelConfig,
    pub tokenizer: &'a Tokenizer,
}

/// What the pipeline has loaded for a call.
#[derive(Clone, Copy)]
pub struct Available<'a> {
    pub target: LoadedModel<'a>,
    /// Whether the target's MTP layers are loaded.
    pub mtp: bool,
    pub assistant: Option<LoadedModel<'a>>,
}

impl SpeculationMethod {
    /// The method for a call with the resolved `cfg`: `named` when given, else Transformers' precedence.
    pub fn resolve(cfg: &GenerationConfig, named: Option<MethodName>, models: &Available<'_>) -> Result<Self> {
        Ok(choose(cfg, named, models)?.map_or(SpeculationMethod::None, |(_, method)| method))
    }

    /// Whether the drafter can propose trees: prompt lookup, and an assistant sharing the target's tokenizer.
    pub fn drafts_trees(self) -> bool {
        matches!(self, SpeculationMethod::None | SpeculationMethod::PromptLookup { .. } | SpeculationMethod::Assistant)
    }

    /// Whether the method drafts with the assistant model.
    pub fn uses_assistant(self) -> bool {
        matches!(
            self,
            SpeculationMethod::Assistant
                | SpeculationMethod::Auto { assistant: true }
                | SpeculationMethod::Gemma4Assistant
                | SpeculationMethod::Universal
                | SpeculationMethod::UniversalSampling
        )
    }
}

/// The registry entry a call runs and the drafter it resolved to; `None` for plain decoding. `named` when
/// given, else the first entry the options choose.
pub fn choose(
    cfg: &GenerationConfig,
    named: Option<MethodName>,
    models: &Available<'_>,
) -> Result<Option<(&'static Method, SpeculationMethod)>> {
    let method = match named {
        Some(name) => name.method(),
        None => REGISTRY.iter().find(|m| (m.chosen)(cfg, models)),
    };
    method.map(|m| Ok((m, (m.resolve)(cfg, models)?))).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> GenerationOptions {
        GenerationOptions {
            max_new_tokens: Some(7),
            prompt_lookup_num_tokens: Some(3),
            max_matching_ngram_size: Some(2),
            num_assistant_tokens: Some(5),
            num_assistant_tokens_schedule: Some("constant".into()),
            assistant_confidence_threshold: Some(0.3),
            cost_aware_drafting: Some(false),
            use_mtp: Some(true),
            assistant_early_exit: Some(4),
            assistant_ensemble_weight: Some(0.5),
            ..Default::default()
        }
    }

    #[test]
    fn a_named_method_keeps_only_its_own_fields() {
        let all = all();
        let pl = MethodName::PromptLookup.scope(&all).unwrap();
        assert_eq!((pl.prompt_lookup_num_tokens, pl.max_matching_ngram_size), (Some(3), Some(2)));
        assert_eq!((pl.assistant_early_exit, pl.use_mtp, pl.num_assistant_tokens), (None, None, None));
        assert_eq!(
            (pl.assistant_ensemble_weight, pl.max_new_tokens, pl.cost_aware_drafting),
            (None, Some(7), Some(false))
        );
        let am = MethodName::AssistantModel.scope(&all).unwrap();
        assert_eq!((am.prompt_lookup_num_tokens, am.assistant_early_exit, am.use_mtp), (None, None, None));
        assert_eq!((am.num_assistant_tokens, am.assistant_ensemble_weight), (Some(5), Some(0.5)));
        let ee = MethodName::EarlyExit.scope(&all).unwrap();
        assert_eq!(
            (ee.assistant_early_exit, ee.num_assistant_tokens, ee.prompt_lookup_num_tokens),
            (Some(4), Some(5), None)
        );
        let mtp = MethodName::Mtp.scope(&all).unwrap();
        assert_eq!((mtp.use_mtp, mtp.prompt_lookup_num_tokens), (Some(true), None));
        let plain = MethodName::Plain.scope(&all).unwrap();
        assert_eq!(plain, GenerationOptions { max_new_tokens: Some(7), ..Default::default() });
        let own = MethodName::PromptLookup.own_options(&all).unwrap();
        assert_eq!((own.max_new_tokens, own.prompt_lookup_num_tokens), (None, Some(3)));
        let none = GenerationOptions::default();
        assert_eq!(MethodName::PromptLookup.scope(&none).unwrap().prompt_lookup_num_tokens, Some(10));
        assert!(MethodName::EarlyExit.scope(&none).unwrap_err().to_string().contains("assistant_early_exit"));
    }

    #[test]
    fn names_round_trip_and_unknown_ones_list_the_methods() {
        for name in METHODS.split(", ") {
            assert_eq!(name.parse::<MethodName>().unwrap().as_str(), name);
        }
        let e = "medusa".parse::<MethodName>().unwrap_err().to_string();
        assert!(e.contains("`medusa` is unknown") && e.contains(&*METHODS), "{e}");
    }

    #[test]
    fn precedence_and_validation_follow_transformers() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tiny-llama");
        let tok = Tokenizer::from_hf_dir(&dir).unwrap();
        let config = ModelConfig::from_hf_file(&dir.join("config.json")).unwrap();
        let target = LoadedModel { path: Path::new("t"), config: &config, tokenizer: &tok };
        let models = Available { target, mtp: false, assistant: None };
        let resolve = |o: &GenerationOptions, named| {
            SpeculationMethod::resolve(&GenerationConfig::from_options(o), named, &models)
        };
        let mut o = all();
        assert_eq!(resolve(&o, None).unwrap(), SpeculationMethod::EarlyExit { layers: 4 });
        o.assistant_early_exit = None;
        assert!(resolve(&o, None).unwrap_err().to_string().contains("not supported with prompt lookup decoding"));
        o.assistant_ensemble_weight = None;
        let pl = SpeculationMethod::PromptLookup { num_tokens: 3, max_matching_ngram_size: 2 };
        assert_eq!(resolve(&o, None).unwrap(), pl);
        o.prompt_lookup_num_tokens = None;
        assert!(resolve(&o, None).unwrap_err().to_string().contains("Could not find `num_mtp_layers`"));
        o.use_mtp = None;
        assert_eq!(resolve(&o, None).unwrap(), SpeculationMethod::None);
        assert_eq!(resolve(&all(), Some(MethodName::Plain)).unwrap(), SpeculationMethod::None);
        let e = resolve(&GenerationOptions::default(), Some(MethodName::AssistantModel)).unwrap_err();
        assert!(e.to_string().contains("needs an assistant model"), "{e}");
    }
}
