//! The `augur` binary: a thin shell over the library's pipeline.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use augur::generation::config::GenerationOptions;
use augur::pipeline::{CallOptions, Prompt};
use augur::tokenizer::ChatMessage;
use clap::{Args, CommandFactory, Parser, Subcommand};

mod bench;
mod chat;
mod models;
mod serve;
mod speculation;
mod ui;

use speculation::SpeculationArgs;

#[derive(Parser)]
#[command(name = "augur", version, about = "Assisted (speculative) decoding for LLMs, with Transformers' semantics")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (argument, --prompt-file, or standard input).
    Generate(GenerateArgs),
    /// Chat with a model in the terminal: multi-turn, streamed, with per-turn speed and speculation stats.
    Chat(chat::ChatArgs),
    /// Fetch catalogue models into augur's model cache (sha256-checked; `all` for every one).
    Pull(models::PullArgs),
    /// The catalogue's models and what augur's model cache holds, with sizes.
    List,
    /// Describe a model: architecture, parameters, quantization, context, tokenizer, chat template.
    Info {
        /// A GGUF file, a model directory, a catalogue name or a Hugging Face repo id (default: the default model).
        model: Option<String>,
    },
    /// Serve the model over an OpenAI-compatible HTTP API (completions, chat completions, models, metrics).
    Serve(serve::ServeArgs),
    /// Measure speed: prefill, decode and k-token forward cost; or, with --prompts, plain decoding against
    /// speculative methods over Spec-Bench prompts.
    Bench(bench::BenchArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard output.
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

/// The help text of every `--model` flag.
pub(crate) const MODEL_HELP: &str = "A GGUF file, a model directory, a file in augur's model cache, a catalogue name \
    (see `augur list`; pulled on first use) or a Hugging Face repo id in the local cache [default: qwen2.5-coder-0.5b]";

#[derive(Args)]
struct GenerateArgs {
    /// The prompt; read from --prompt-file or standard input when absent.
    prompt: Option<String>,
    /// Read the prompt from this file.
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    #[arg(long, help = MODEL_HELP)]
    model: Option<String>,
    /// Apply the model's chat template to the prompt (as a user message).
    #[arg(long)]
    chat: bool,
    /// A system message (implies --chat).
    #[arg(long)]
    system: Option<String>,
    /// Worker threads for the tensor kernels (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Print one JSON object {text, tokens, finish_reason, stats} instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    speculation: SpeculationArgs,
    #[command(flatten)]
    load: ui::LoadArgs,
}

/// Length, sampling and stopping flags, shared by `generate` and `chat` (Transformers' names and defaults).
#[derive(Args)]
pub(crate) struct SamplingArgs {
    /// Most new tokens (default: the model's generation config, else 20; `augur chat`: 512).
    #[arg(long, value_name = "N")]
    max_new_tokens: Option<usize>,
    /// Fewest new tokens: end-of-sequence is suppressed before them.
    #[arg(long, value_name = "N")]
    min_new_tokens: Option<usize>,
    /// Sample instead of greedy decoding (default: the model's generation config).
    #[arg(long)]
    do_sample: bool,
    /// Sampling temperature.
    #[arg(long, value_name = "T")]
    temperature: Option<f32>,
    /// Sample from the K most likely tokens only.
    #[arg(long, value_name = "K")]
    top_k: Option<usize>,
    /// Nucleus sampling: the smallest set of tokens whose probability reaches P.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Drop tokens less likely than P times the most likely one.
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Penalise tokens already in the sequence (1 = none).
    #[arg(long, value_name = "R")]
    repetition_penalty: Option<f32>,
    /// Random seed for sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop", value_name = "STR")]
    stop: Vec<String>,
    /// End-of-sequence token id (repeatable); overrides the model's.
    #[arg(long = "eos-token-id", value_name = "ID")]
    eos_token_id: Vec<u32>,
}

impl SamplingArgs {
    /// The generation options of these flags and the speculation flags.
    pub(crate) fn options(&self, speculation: &SpeculationArgs) -> GenerationOptions {
        GenerationOptions {
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: self.min_new_tokens,
            do_sample: self.do_sample.then_some(true),
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            stop_strings: (!self.stop.is_empty()).then(|| self.stop.clone()),
            eos_token_id: (!self.eos_token_id.is_empty()).then(|| self.eos_token_id.clone()),
            ..speculation.options()
        }
    }
}

impl GenerateArgs {
    fn prompt_text(&self) -> Result<String> {
        match (&self.prompt, &self.prompt_file) {
            (Some(_), Some(_)) => {
                bail!("give the prompt either as an argument or with --prompt-file, not both")
            }
            (Some(p), None) => Ok(p.clone()),
            (None, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display())),
            (None, None) => {
                let mut s = String::new();
                std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from standard input")?;
                Ok(s)
            }
        }
    }
}

/// `--threads`: sizes the kernels' thread pool (see `augur::threads`).
pub(crate) fn set_threads(threads: Option<usize>) -> Result<()> {
    if threads == Some(0) {
        bail!("--threads must be at least 1");
    }
    Ok(augur::threads::set_threads(threads)?)
}

fn generate(args: GenerateArgs) -> Result<()> {
    set_threads(args.threads)?;
    let text = args.prompt_text()?;
    let prompt = if args.chat || args.system.is_some() {
        let mut messages = Vec::new();
        if let Some(s) = &args.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(text));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(text)
    };
    let mut pipe = ui::load_pipeline(&args.speculation.load_spec(args.model.as_deref(), &args.load))?;
    let call = CallOptions {
        return_full_text: Some(false),
        method: args.speculation.method(&pipe)?,
        ..CallOptions::new(args.sampling.options(&args.speculation))
    };
    if args.json {
        let out = pipe.call(&prompt, &call, None)?;
        let json = serde_json::json!({
            "text": out.text,
            "tokens": out.tokens,
            "finish_reason": out.finish_reason.as_str(),
            "stats": out.stats,
        });
        println!("{}", serde_json::to_string(&json)?);
    } else {
        let stdout = std::io::stdout();
        let mut print = |chunk: &str| {
            let mut lock = stdout.lock();
            let _ = lock.write_all(chunk.as_bytes());
            let _ = lock.flush();
        };
        let out = pipe.call(&prompt, &call, Some(&mut print))?;
        println!();
        let s = &out.stats;
        let mut line = format!(
            "[{} · {} prompt + {} new tokens · {:.2} s · {:.1} tok/s · prefill {:.2} s · {} target forwards · {}]",
            s.method,
            s.prompt_tokens,
            s.new_tokens,
            s.seconds,
            s.decode_tokens_per_s,
            s.prefill_seconds,
            s.target_forwards,
            out.finish_reason.as_str()
        );
        if s.method != "plain" {
            line.push_str(&format!(
                " [accepted {}/{} drafts ({:.0}%) · {:.2} tokens per forward]",
                s.accepted,
                s.drafted,
                100.0 * s.acceptance_rate,
                s.mean_accepted_per_forward
            ));
        }
        line.push_str(&ui::lossy_note(&pipe));
        eprintln!("{line}");
    }
    Ok(())
}

fn info(model: Option<String>) -> Result<()> {
    let pipe = ui::load_pipeline(&ui::LoadArgs::default().spec(model.as_deref()))?;
    let (lm, path) = (&pipe.target, &pipe.target.path);
    let c = lm.config();
    let quant: Vec<String> = lm.weights.dtypes.iter().map(|(d, n)| format!("{d}×{n}")).collect();
    println!("model:          {}", path.display());
    println!("architecture:   {}", c.architecture.name());
    println!("format:         {}", lm.weights.format);
    println!("parameters:     {} ({:.1} M)", lm.weights.parameters, lm.weights.parameters as f64 / 1e6);
    println!("quantization:   {}", quant.join(", "));
    println!(
        "layers:         {} (hidden {}, heads {}/{} kv, head_dim {})",
        c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    );
    println!("context length: {}", c.max_position_embeddings);
    println!("vocabulary:     {}", c.vocab_size);
    println!("tokenizer:      {} ({} tokens)", lm.tokenizer.kind(), lm.tokenizer.vocab_size());
    println!("chat template:  {}", if lm.tokenizer.chat_template().is_some() { "yes" } else { "no" });
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => generate(args),
        Command::Chat(args) => chat::run(args),
        Command::Pull(args) => models::pull(args),
        Command::List => models::list(),
        Command::Info { model } => info(model),
        Command::Serve(args) => serve::serve(args),
        Command::Bench(args) => bench::run(args),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "augur", &mut std::io::stdout());
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every flag and argument of every subcommand says what it does in `--help`.
    #[test]
    fn every_flag_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut cmd = Cli::command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "augur", &mut missing);
        assert!(missing.is_empty(), "flags without help: {missing:?}");
        assert!(cmd.get_subcommands().any(|c| c.get_name() == "chat"));
    }
}
