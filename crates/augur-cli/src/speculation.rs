//! The speculation flags shared by `generate`, `bench` and `serve`: declared once, converted once.

use std::path::PathBuf;

use anyhow::Result;
use augur::generation::config::GenerationOptions;
use augur::pipeline::Pipeline;
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
            cost_aware_drafting: self.cost_aware_drafting,
            use_mtp: self.use_mtp.then_some(true),
            assistant_early_exit: self.assistant_early_exit,
            assistant_ensemble_weight: self.assistant_ensemble_weight,
            ..Default::default()
        }
    }

    /// Attaches `--assistant-model` (and its `--assistant-tokenizer`) to the pipeline, when given.
    pub fn attach_assistant(&self, mut pipe: Pipeline) -> Result<Pipeline> {
        if let Some(a) = &self.assistant_model {
            let path = crate::ui::resolve(Some(a))?.to_string_lossy().into_owned();
            pipe = crate::ui::while_loading("loading the assistant", || pipe.with_assistant(&path))?;
            if let Some(t) = &self.assistant_tokenizer {
                pipe = pipe.with_assistant_tokenizer(t)?;
            }
        }
        Ok(pipe)
    }
}

/// The speculation methods `bench --methods` and a request's `speculation.method` name.
pub const METHODS: &str = "prompt_lookup, assistant_model, early_exit, mtp";

/// The options of one speculation method: the fields of `o` that this method reads, so that the flags or request
/// fields of other methods do not switch it to another drafter (the pipeline picks the drafter by which fields are
/// set). `assistant_model` drafts with the pipeline's assistant, by the method that its tokenizer allows.
pub fn method_options(method: &str, o: &GenerationOptions) -> Result<GenerationOptions, String> {
    let model_drafter = GenerationOptions {
        num_assistant_tokens: o.num_assistant_tokens,
        num_assistant_tokens_schedule: o.num_assistant_tokens_schedule.clone(),
        assistant_confidence_threshold: o.assistant_confidence_threshold,
        assistant_ensemble_weight: o.assistant_ensemble_weight,
        ..Default::default()
    };
    Ok(match method {
        "prompt_lookup" => GenerationOptions {
            prompt_lookup_num_tokens: Some(o.prompt_lookup_num_tokens.unwrap_or(10)),
            max_matching_ngram_size: o.max_matching_ngram_size,
            ..Default::default()
        },
        "assistant_model" => model_drafter,
        "early_exit" => GenerationOptions {
            assistant_early_exit: Some(
                o.assistant_early_exit.ok_or("method `early_exit` needs `assistant_early_exit` (a layer count)")?,
            ),
            ..model_drafter
        },
        "mtp" => GenerationOptions { use_mtp: Some(true), ..Default::default() },
        other => return Err(format!("method `{other}` is unknown (expected {METHODS})")),
    })
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

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

    #[test]
    fn defaults_per_subcommand() {
        assert_eq!(speculation("bench", &[]).prompt_lookup_num_tokens, Some(10));
        assert_eq!(speculation("generate", &[]).prompt_lookup_num_tokens, None);
        assert_eq!(speculation("serve", &[]).prompt_lookup_num_tokens, None);
        assert!(Cli::try_parse_from(["augur", "generate", "--assistant-tokenizer=t.json"]).is_err());
    }

    #[test]
    fn a_method_keeps_only_its_own_fields() {
        let all = speculation("generate", &FLAGS[..11]).options();
        let pl = method_options("prompt_lookup", &all).unwrap();
        assert_eq!((pl.prompt_lookup_num_tokens, pl.max_matching_ngram_size), (Some(3), Some(2)));
        assert_eq!((pl.assistant_early_exit, pl.use_mtp, pl.num_assistant_tokens), (None, None, None));
        let am = method_options("assistant_model", &all).unwrap();
        assert_eq!((am.prompt_lookup_num_tokens, am.assistant_early_exit, am.use_mtp), (None, None, None));
        assert_eq!((am.num_assistant_tokens, am.assistant_ensemble_weight), (Some(5), Some(0.5)));
        let ee = method_options("early_exit", &all).unwrap();
        assert_eq!(
            (ee.assistant_early_exit, ee.num_assistant_tokens, ee.prompt_lookup_num_tokens),
            (Some(4), Some(5), None)
        );
        let mtp = method_options("mtp", &all).unwrap();
        assert_eq!((mtp.use_mtp, mtp.prompt_lookup_num_tokens), (Some(true), None));
        let none = GenerationOptions::default();
        assert_eq!(method_options("prompt_lookup", &none).unwrap().prompt_lookup_num_tokens, Some(10));
        assert!(method_options("early_exit", &none).unwrap_err().contains("assistant_early_exit"));
        assert!(method_options("medusa", &none).unwrap_err().contains("`medusa` is unknown"));
    }
}
