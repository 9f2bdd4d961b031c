//! The `augur` binary: a thin shell over the library's pipeline.

use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use augur::generation::config::GenerationOptions;
use augur::pipeline::{LoadedLm, Pipeline, Prompt};
use augur::tokenizer::ChatMessage;
use clap::{Args, Parser, Subcommand};

mod bench;
mod serve;
mod speculation;

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
    /// Describe a model: architecture, parameters, quantization, context, tokenizer, chat template.
    Info {
        /// A GGUF file, a model directory or a Hugging Face repo id (default: the default model).
        model: Option<String>,
    },
    /// Serve the model over an OpenAI-compatible HTTP API (completions, chat completions, models, metrics).
    Serve(serve::ServeArgs),
    /// Measure speed: prefill, decode and k-token forward cost; or, with --prompts, plain decoding against
    /// speculative methods over Spec-Bench prompts.
    Bench(bench::BenchArgs),
}

#[derive(Args)]
struct GenerateArgs {
    /// The prompt; read from --prompt-file or standard input when absent.
    prompt: Option<String>,
    #[arg(long)]
    prompt_file: Option<PathBuf>,
    /// A GGUF file, a model directory or a Hugging Face repo id in the local cache
    /// (default: SmolLM2-135M-Instruct Q4_1, fetched on first use).
    #[arg(long)]
    model: Option<String>,
    /// Apply the model's chat template to the prompt (as a user message).
    #[arg(long)]
    chat: bool,
    /// A system message (implies --chat).
    #[arg(long)]
    system: Option<String>,
    #[arg(long)]
    max_new_tokens: Option<usize>,
    #[arg(long)]
    min_new_tokens: Option<usize>,
    /// Sample instead of greedy decoding.
    #[arg(long)]
    do_sample: bool,
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long)]
    repetition_penalty: Option<f32>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop when the text contains this string (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// End-of-sequence token id (repeatable); overrides the model's.
    #[arg(long = "eos-token-id")]
    eos_token_id: Vec<u32>,
    /// Worker threads for the tensor kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Print one JSON object {text, tokens, finish_reason, stats} instead of streaming text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    speculation: SpeculationArgs,
}

impl GenerateArgs {
    fn options(&self) -> GenerationOptions {
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
            ..self.speculation.options()
        }
    }

    fn prompt_text(&self) -> Result<String> {
        match (&self.prompt, &self.prompt_file) {
            (Some(_), Some(_)) => bail!("give the prompt either as an argument or with --prompt-file, not both"),
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

/// candle's CPU kernels run on rayon's global pool, sized by `RAYON_NUM_THREADS` when it is first used.
pub(crate) fn set_threads(threads: Option<usize>) -> Result<()> {
    if let Some(n) = threads {
        if n == 0 {
            bail!("--threads must be at least 1");
        }
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    Ok(())
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
    let mut pipe = args.speculation.attach_assistant(Pipeline::load(args.model.as_deref())?)?;
    let options = args.options();
    if args.json {
        let out = pipe.generate(&prompt, &options, None)?;
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
        let out = pipe.generate(&prompt, &options, Some(&mut print))?;
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
        eprintln!("{line}");
    }
    Ok(())
}

fn info(model: Option<String>) -> Result<()> {
    let path = augur::resolve::resolve_model(model.as_deref())?;
    let lm = LoadedLm::load(&path, &augur::Device::Cpu)?;
    let c = lm.config();
    let quant: Vec<String> = lm.weights.dtypes.iter().map(|(d, n)| format!("{d}×{n}")).collect();
    println!("model:          {}", path.display());
    println!("architecture:   {}", c.architecture.name());
    println!("format:         {}", lm.weights.format);
    println!("parameters:     {} ({:.1} M)", lm.weights.parameters, lm.weights.parameters as f64 / 1e6);
    println!("quantization:   {}", quant.join(", "));
    println!("layers:         {} (hidden {}, heads {}/{} kv, head_dim {})", c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim);
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
        Command::Info { model } => info(model),
        Command::Serve(args) => serve::serve(args),
        Command::Bench(args) => bench::run(args),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
