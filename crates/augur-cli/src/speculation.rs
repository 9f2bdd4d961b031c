//! The speculation flags shared by `generate`, `bench` and `serve`: declared once, converted once.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Result};
use augur::generation::config::GenerationOptions;
use augur::pipeline::Pipeline;
use augur::speculation::method::MethodName;
use augur::speculation::registry::Knob;
use clap::{Args, ValueEnum};

/// How the draft length changes between rounds (Transformers' `num_assistant_tokens_schedule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Schedule {
    /// The same draft length every round.
    Constant,
    /// +2 after a round whose drafts were all accepted, −1 otherwise, carried over to the next call.
    Heuristic,
    /// As heuristic, but each call starts again from `num_assistant_tokens`.
    #[value(name = "heuristic_transient")]
    HeuristicTransient,
}

impl Schedule {
    fn as_str(self) -> &'static str {
        match self {
            Schedule::Constant => "constant",
            Schedule::Heuristic => "heuristic",
            Schedule::HeuristicTransient => "heuristic_transient",
        }
    }
}

#[derive(Args)]
pub struct SpeculationArgs {
    /// The speculation method: `auto` (suffix decoding, and the assistant when one is loaded, chosen round by
    /// round where drafting pays), `off` (plain decoding), or a method by name (prompt_lookup, suffix,
    /// assistant_model, early_exit, mtp). Default: the method the other flags choose, else `auto`.
    #[arg(long, value_name = "METHOD")]
    pub speculation: Option<String>,
    /// A smaller model that drafts tokens for the target (with another tokenizer: universal assisted decoding).
    #[arg(long)]
    pub assistant_model: Option<String>,
    /// The assistant's tokenizer (a tokenizer.json, or a directory holding one) when it is not stored with it.
    #[arg(long, requires = "assistant_model")]
    pub assistant_tokenizer: Option<PathBuf>,
    /// Prompt lookup decoding: copy up to this many tokens from earlier n-gram matches.
    #[arg(long, value_name = "N")]
    pub prompt_lookup_num_tokens: Option<usize>,
    /// Prompt lookup: the longest n-gram matched against the earlier tokens (default 2).
    #[arg(long, value_name = "N")]
    pub max_matching_ngram_size: Option<usize>,
    /// Assistant model: most tokens drafted per round (default 20).
    #[arg(long, value_name = "N")]
    pub num_assistant_tokens: Option<usize>,
    /// Assistant model: how the draft length changes from round to round (default constant).
    #[arg(long, value_enum)]
    pub num_assistant_tokens_schedule: Option<Schedule>,
    /// Assistant model: stop drafting a round once the assistant's top probability falls below this (default 0.4).
    #[arg(long, value_name = "P")]
    pub assistant_confidence_threshold: Option<f32>,
    /// Assistant model: adapt the confidence threshold after every round by the ROC rule (default true).
    #[arg(long)]
    pub assistant_confidence_adaptive: Option<bool>,
    /// Universal assisted decoding: assistant tokens re-decoded per round when mapping drafts (default 10).
    #[arg(long, value_name = "N")]
    pub assistant_lookbehind: Option<usize>,
    /// Universal assisted decoding: target tokens re-encoded for the assistant per round (default 10).
    #[arg(long, value_name = "N")]
    pub target_lookbehind: Option<usize>,
    /// Assistant model: draft from the LM head over this many of the most frequent tokens, plus the prompt's
    /// and EOS (default 32768 for vocabularies above 131072 under cost-aware drafting; 0: the whole head).
    #[arg(long, value_name = "N")]
    pub draft_vocab_size: Option<usize>,
    /// Cap drafts by their measured cost, falling back to plain steps where drafting does not pay (default
    /// true); false gives Transformers' exact round structure.
    #[arg(long)]
    pub cost_aware_drafting: Option<bool>,
    /// Draft with the checkpoint's own multi-token-prediction layers (DeepSeek-V3, GLM-4.5), one token per layer.
    #[arg(long)]
    pub use_mtp: bool,
    /// Self-speculation: the target's first L layers draft (LayerSkip); takes precedence over the other drafters.
    #[arg(long, value_name = "L")]
    pub assistant_early_exit: Option<usize>,
    /// Lossy static ensemble verification: accept drafts against w·p_target + (1−w)·q_draft, 0 < w < 1.
    #[arg(long, value_name = "W")]
    pub assistant_ensemble_weight: Option<f32>,
    /// Tree drafts: above 1, prompt lookup proposes K distinct continuations at once and an assistant model
    /// branches into its top K tokens where unsure; the target verifies the whole tree in one forward.
    #[arg(long, value_name = "K")]
    pub speculative_eagle_topk: Option<usize>,
    /// Tree drafts: most nodes (draft rows) per tree (default 16).
    #[arg(long, value_name = "N")]
    pub speculative_num_draft_tokens: Option<usize>,
    /// Tree drafts: the deepest path (default: the method's draft length).
    #[arg(long, value_name = "N")]
    pub speculative_num_steps: Option<usize>,
    /// Suffix decoding: the deepest match plus draft (default 24; setting it chooses suffix decoding).
    #[arg(long, value_name = "N")]
    pub suffix_max_depth: Option<usize>,
    /// Suffix decoding: draft tokens allowed per matched token (default 1.0).
    #[arg(long, value_name = "F")]
    pub suffix_max_spec_factor: Option<f32>,
    /// Suffix decoding: drafts less probable than this are not proposed (default 0.1).
    #[arg(long, value_name = "P")]
    pub suffix_min_token_prob: Option<f32>,
    /// Suffix decoding: read and feed the cache of earlier outputs (default true; `augur chat` and `augur serve`
    /// keep one, `augur generate` runs one request).
    #[arg(long)]
    pub suffix_global_cache: Option<bool>,
}

impl SpeculationArgs {
    /// The speculation fields of the generation options; the others are left unset.
    pub fn options(&self) -> GenerationOptions {
        GenerationOptions {
            prompt_lookup_num_tokens: self.prompt_lookup_num_tokens,
            max_matching_ngram_size: self.max_matching_ngram_size,
            num_assistant_tokens: self.num_assistant_tokens,
            num_assistant_tokens_schedule: self.num_assistant_tokens_schedule.map(|s| s.as_str().to_string()),
            assistant_confidence_threshold: self.assistant_confidence_threshold,
            assistant_confidence_adaptive: self.assistant_confidence_adaptive,
            assistant_lookbehind: self.assistant_lookbehind,
            target_lookbehind: self.target_lookbehind,
            draft_vocab_size: self.draft_vocab_size,
            cost_aware_drafting: self.cost_aware_drafting,
            use_mtp: self.use_mtp.then_some(true),
            assistant_early_exit: self.assistant_early_exit,
            assistant_ensemble_weight: self.assistant_ensemble_weight,
            speculative_eagle_topk: self.speculative_eagle_topk,
            speculative_num_draft_tokens: self.speculative_num_draft_tokens,
            speculative_num_steps: self.speculative_num_steps,
            suffix_max_depth: self.suffix_max_depth,
            suffix_max_spec_factor: self.suffix_max_spec_factor,
            suffix_min_token_prob: self.suffix_min_token_prob,
            suffix_global_cache: self.suffix_global_cache,
            ..Default::default()
        }
    }

    /// `--speculation`, parsed: `off` is plain decoding, any other name a registry method's; `None` unset.
    pub fn named(&self) -> Result<Option<MethodName>> {
        let Some(name) = self.speculation.as_deref() else { return Ok(None) };
        let method = match name {
            "off" | "plain" | "none" => MethodName::Plain,
            name => name.parse::<MethodName>().map_err(|e| anyhow!("--speculation: {e}"))?,
        };
        // A flag of another method would be dropped without a word: refuse it.
        let (set, unset) = (self.options(), GenerationOptions::default());
        for knob in Knob::all() {
            let mut only = unset.clone();
            (knob.copy)(&set, &mut only);
            let read = method.method().is_some_and(|m| m.each_knob().any(|k| k.name == knob.name));
            if only != unset && !read {
                bail!("--{} is not an option of speculation method `{method}`", knob.name.replace('_', "-"));
            }
        }
        Ok(Some(method))
    }

    /// The method a call on `pipe` runs (see `Pipeline::default_method`): `--speculation` when given, else the
    /// one the flags choose, else `auto`.
    pub fn method(&self, pipe: &Pipeline) -> Result<Option<MethodName>> {
        Ok(pipe.default_method(self.named()?, &self.options()))
    }

    /// What to load: `model` under `load`'s flags, with `--assistant-model` (and its `--assistant-tokenizer`).
    pub fn load_spec(&self, model: Option<&str>, load: &crate::ui::LoadArgs) -> augur::pipeline::LoadSpec {
        augur::pipeline::LoadSpec {
            assistant: self.assistant_model.clone(),
            assistant_tokenizer: self.assistant_tokenizer.clone(),
            ..load.spec(model)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use augur::speculation::registry::Knob;

    use super::*;
    use crate::{Cli, Command};

    const FLAGS: [&str; 13] = [
        "--assistant-model=a",
        "--assistant-tokenizer=t.json",
        "--prompt-lookup-num-tokens=3",
        "--max-matching-ngram-size=2",
        "--num-assistant-tokens=5",
        "--num-assistant-tokens-schedule=constant",
        "--assistant-confidence-threshold=0.3",
        "--cost-aware-drafting=false",
        "--use-mtp",
        "--assistant-early-exit=4",
        "--assistant-ensemble-weight=0.5",
        "--model=m",
        "--threads=1",
    ];

    fn speculation(subcommand: &str, extra: &[&str]) -> SpeculationArgs {
        let argv = ["augur", subcommand].into_iter().chain(extra.iter().copied());
        match Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{subcommand}: {e}")).command {
            Command::Generate(a) => a.speculation,
            Command::Bench(a) => a.speculation,
            Command::Serve(a) => a.speculation,
            _ => unreachable!(),
        }
    }

    #[test]
    fn every_subcommand_takes_every_speculation_flag_and_converts_it_alike() {
        Cli::command().debug_assert();
        let options: Vec<GenerationOptions> =
            ["generate", "bench", "serve"].iter().map(|c| speculation(c, &FLAGS).options()).collect();
        let o = &options[0];
        assert_eq!(o.prompt_lookup_num_tokens, Some(3));
        assert_eq!(o.max_matching_ngram_size, Some(2));
        assert_eq!(o.num_assistant_tokens, Some(5));
        assert_eq!(o.num_assistant_tokens_schedule.as_deref(), Some("constant"));
        assert_eq!(o.assistant_confidence_threshold, Some(0.3));
        assert_eq!(o.cost_aware_drafting, Some(false));
        assert_eq!(o.use_mtp, Some(true));
        assert_eq!(o.assistant_early_exit, Some(4));
        assert_eq!(o.assistant_ensemble_weight, Some(0.5));
        for other in &options[1..] {
            assert_eq!(other, o);
        }
    }

    /// A knob of the registry without its flag, or a flag that does not reach its knob, fails here.
    #[test]
    fn every_registry_knob_is_a_flag_of_every_subcommand_that_sets_that_knob_alone() {
        for knob in Knob::all() {
            let flag = format!("--{}", knob.name.replace('_', "-"));
            for subcommand in ["generate", "bench", "serve"] {
                let parsed = ["", "=1", "=true", "=constant"].iter().find_map(|value| {
                    let argv = ["augur", subcommand, &format!("{flag}{value}")].map(String::from);
                    match Cli::try_parse_from(argv).ok()?.command {
                        Command::Generate(a) => Some(a.speculation),
                        Command::Bench(a) => Some(a.speculation),
                        Command::Serve(a) => Some(a.speculation),
                        _ => None,
                    }
                });
                let args = parsed.unwrap_or_else(|| panic!("`augur {subcommand}` has no flag {flag}"));
                let unset = speculation(subcommand, &[]).options();
                let options = args.options();
                let mut only = unset.clone();
                (knob.copy)(&options, &mut only);
                assert!(only != unset && only == options, "{subcommand} {flag} does not set `{}` alone", knob.name);
            }
        }
    }

    #[test]
    fn defaults_per_subcommand() {
        assert_eq!(speculation("bench", &[]).prompt_lookup_num_tokens, Some(10));
        assert_eq!(speculation("generate", &[]).prompt_lookup_num_tokens, None);
        assert_eq!(speculation("serve", &[]).prompt_lookup_num_tokens, None);
        assert!(Cli::try_parse_from(["augur", "generate", "--assistant-tokenizer=t.json"]).is_err());
    }
}
