//! Which drafter a call runs, decided once per call: named by the caller, or picked from the options with
//! Transformers' precedence (spec 1.3: early exit, prompt lookup, MTP, then the assistant model). Every error
//! about the choice is raised here, so that the drafter factory only builds and the pipeline only runs.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::models::{Architecture, ModelConfig};
use crate::tokenizer::Tokenizer;

/// The methods a caller can name, as the CLI's `bench --methods` and a request's `speculation.method` list them.
pub const METHODS: &str = "prompt_lookup, assistant_model, early_exit, mtp";

/// Tokens copied per prompt-lookup round when the method is named without `prompt_lookup_num_tokens`.
pub const DEFAULT_PROMPT_LOOKUP_NUM_TOKENS: usize = 10;

/// A method as a caller names it. A named method is the one that runs, whatever speculation fields of other
/// methods the options carry (a server's defaults, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MethodName {
    /// Plain decoding.
    Plain,
    PromptLookup,
    /// The pipeline's assistant, by the method its architecture and tokenizer allow.
    AssistantModel,
    EarlyExit,
    Mtp,
}

impl MethodName {
    pub fn as_str(self) -> &'static str {
        match self {
            MethodName::Plain => "plain",
            MethodName::PromptLookup => "prompt_lookup",
            MethodName::AssistantModel => "assistant_model",
            MethodName::EarlyExit => "early_exit",
            MethodName::Mtp => "mtp",
        }
    }

    /// The speculation fields of `o` that this method reads, and nothing else: a request's or a flag's fields of
    /// other methods can then change neither the drafter nor the verification (an ensemble weight under prompt
    /// lookup, say).
    pub fn own_options(self, o: &GenerationOptions) -> Result<GenerationOptions> {
        let model_drafter = GenerationOptions {
            num_assistant_tokens: o.num_assistant_tokens,
            num_assistant_tokens_schedule: o.num_assistant_tokens_schedule.clone(),
            assistant_confidence_threshold: o.assistant_confidence_threshold,
            assistant_confidence_adaptive: o.assistant_confidence_adaptive,
            assistant_ensemble_weight: o.assistant_ensemble_weight,
            cost_aware_drafting: o.cost_aware_drafting,
            ..tree_options(o)
        };
        Ok(match self {
            MethodName::Plain => GenerationOptions::default(),
            MethodName::PromptLookup => GenerationOptions {
                prompt_lookup_num_tokens: Some(o.prompt_lookup_num_tokens.unwrap_or(DEFAULT_PROMPT_LOOKUP_NUM_TOKENS)),
                max_matching_ngram_size: o.max_matching_ngram_size,
                cost_aware_drafting: o.cost_aware_drafting,
                ..tree_options(o)
            },
            MethodName::AssistantModel => GenerationOptions {
                assistant_lookbehind: o.assistant_lookbehind,
                target_lookbehind: o.target_lookbehind,
                ..model_drafter
            },
            MethodName::EarlyExit => GenerationOptions {
                assistant_early_exit: Some(early_exit_layers(o.assistant_early_exit)?),
                ..model_drafter
            },
            MethodName::Mtp => GenerationOptions {
                use_mtp: Some(true),
                cost_aware_drafting: o.cost_aware_drafting,
                ..Default::default()
            },
        })
    }

    /// `o` with its speculation fields narrowed to [`MethodName::own_options`]; sampling, length and stopping
    /// fields pass unchanged.
    pub fn scope(self, o: &GenerationOptions) -> Result<GenerationOptions> {
        let mut scoped = without_speculation(o);
        scoped.merge(&self.own_options(o)?);
        Ok(scoped)
    }
}

/// The tree-drafting fields of `o` alone.
fn tree_options(o: &GenerationOptions) -> GenerationOptions {
    GenerationOptions {
        speculative_eagle_topk: o.speculative_eagle_topk,
        speculative_num_draft_tokens: o.speculative_num_draft_tokens,
        speculative_num_steps: o.speculative_num_steps,
        ..Default::default()
    }
}

/// `o` without any speculation field.
pub fn without_speculation(o: &GenerationOptions) -> GenerationOptions {
    GenerationOptions {
        prompt_lookup_num_tokens: None,
        max_matching_ngram_size: None,
        speculative_eagle_topk: None,
        speculative_num_draft_tokens: None,
        speculative_num_steps: None,
        num_assistant_tokens: None,
        num_assistant_tokens_schedule: None,
        assistant_confidence_threshold: None,
        assistant_confidence_adaptive: None,
        cost_aware_drafting: None,
        assistant_early_exit: None,
        assistant_ensemble_weight: None,
        use_mtp: None,
        assistant_lookbehind: None,
        target_lookbehind: None,
        ..o.clone()
    }
}

fn early_exit_layers(layers: Option<usize>) -> Result<usize> {
    layers
        .ok_or_else(|| Error::InvalidOption("method `early_exit` needs `assistant_early_exit` (a layer count)".into()))
}

impl FromStr for MethodName {
    type Err = Error;

    /// One of [`METHODS`]; plain decoding has a name of its own in each caller (`off`, `plain`).
    fn from_str(name: &str) -> Result<Self> {
        Ok(match name {
            "prompt_lookup" => MethodName::PromptLookup,
            "assistant_model" => MethodName::AssistantModel,
            "early_exit" => MethodName::EarlyExit,
            "mtp" => MethodName::Mtp,
            other => return Err(Error::InvalidOption(format!("method `{other}` is unknown (expected {METHODS})"))),
        })
    }
}

impl fmt::Display for MethodName {
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
        let Some(named) = named else {
            return if let Some(layers) = cfg.assistant_early_exit {
                Ok(SpeculationMethod::EarlyExit { layers })
            } else if let Some(n) = cfg.prompt_lookup_num_tokens {
                prompt_lookup(cfg, n)
            } else if cfg.use_mtp {
                mtp(models)
            } else if let Some(a) = &models.assistant {
                assistant(cfg, &models.target, a)
            } else {
                Ok(SpeculationMethod::None)
            };
        };
        match named {
            MethodName::Plain => Ok(SpeculationMethod::None),
            MethodName::EarlyExit => {
                Ok(SpeculationMethod::EarlyExit { layers: early_exit_layers(cfg.assistant_early_exit)? })
            }
            MethodName::PromptLookup => {
                prompt_lookup(cfg, cfg.prompt_lookup_num_tokens.unwrap_or(DEFAULT_PROMPT_LOOKUP_NUM_TOKENS))
            }
            MethodName::Mtp => mtp(models),
            MethodName::AssistantModel => match &models.assistant {
                Some(a) => assistant(cfg, &models.target, a),
                None => Err(Error::InvalidOption("method `assistant_model` needs an assistant model".into())),
            },
        }
    }

    /// Whether the method drafts with the assistant model.
    pub fn uses_assistant(self) -> bool {
        matches!(
            self,
            SpeculationMethod::Assistant
                | SpeculationMethod::Gemma4Assistant
                | SpeculationMethod::Universal
                | SpeculationMethod::UniversalSampling
        )
    }
}

fn prompt_lookup(cfg: &GenerationConfig, num_tokens: usize) -> Result<SpeculationMethod> {
    if cfg.assistant_ensemble_weight.is_some() {
        return Err(Error::InvalidOption(
            "Setting `assistant_ensemble_weight` requires candidate logits from the assistant model. It is not \
             supported with prompt lookup decoding."
                .into(),
        ));
    }
    Ok(SpeculationMethod::PromptLookup { num_tokens, max_matching_ngram_size: cfg.effective_max_matching_ngram_size() })
}

fn mtp(models: &Available<'_>) -> Result<SpeculationMethod> {
    let target = &models.target;
    let num_mtp_layers = target.config.num_mtp_layers;
    if models.mtp {
        Ok(SpeculationMethod::Mtp)
    } else if num_mtp_layers > 0 {
        Err(Error::InvalidOption(format!(
            "`use_mtp`: {} declares {num_mtp_layers} MTP layer(s) (`num_nextn_predict_layers`) but holds no MTP \
             weights (`model.layers.{}.*`)",
            target.path.display(),
            target.config.num_hidden_layers
        )))
    } else {
        Err(Error::InvalidOption(
            "Could not find `num_mtp_layers` in the model config. This model probably has no associated mtp weights."
                .into(),
        ))
    }
}

fn assistant(cfg: &GenerationConfig, target: &LoadedModel<'_>, a: &LoadedModel<'_>) -> Result<SpeculationMethod> {
    if a.config.architecture == Architecture::Gemma4Assistant {
        if target.config.architecture != Architecture::Gemma4 {
            return Err(Error::InvalidOption(format!(
                "the Gemma 4 assistant drafts only for a Gemma 4 target, not {}",
                target.config.architecture.name()
            )));
        }
        if a.config.vocab_size != target.config.vocab_size {
            return Err(Error::InvalidOption(format!(
                "the Gemma 4 assistant's vocabulary ({}) differs from the target's ({})",
                a.config.vocab_size, target.config.vocab_size
            )));
        }
        Ok(SpeculationMethod::Gemma4Assistant)
    } else if same_tokenizer(target.tokenizer, a.tokenizer) {
        Ok(SpeculationMethod::Assistant)
    } else if cfg.do_sample {
        Ok(SpeculationMethod::UniversalSampling)
    } else {
        Ok(SpeculationMethod::Universal)
    }
}

/// Whether the assistant can draft target ids directly: the same vocabulary and the same encodings (the
/// embeddings may still differ by padding rows). Otherwise the universal methods translate.
fn same_tokenizer(target: &Tokenizer, assistant: &Tokenizer) -> bool {
    let probe = ["Hello, world!", " def main():\n    return 42", "Ünïcödé ✓ 日本語"];
    target.vocab_size() == assistant.vocab_size()
        && probe
            .iter()
            .all(|p| matches!((target.encode(p, false), assistant.encode(p, false)), (Ok(a), Ok(b)) if a == b))
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
        assert!(e.contains("`medusa` is unknown") && e.contains(METHODS), "{e}");
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
