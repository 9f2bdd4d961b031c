//! `augur chat`: a multi-turn conversation in the terminal, as `llama-cli` or `ollama run` hold one. Each turn
//! renders the whole history with the model's chat template and streams the answer; Ctrl-C stops the answer
//! (through the pipeline's cancel flag), not the program.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use augur::generation::output::GenerationStats;
use augur::pipeline::{CallOptions, Prompt};
use augur::speculation::suffix_cache::{SuffixCache, SuffixCacheRef, DEFAULT_SUFFIX_CACHE_TOKENS};
use augur::tokenizer::ChatMessage;
use clap::Args;

use crate::speculation::SpeculationArgs;
use crate::SamplingArgs;

/// New tokens per answer when `--max-new-tokens` is not given (Transformers' 20 would cut most answers short).
const CHAT_MAX_NEW_TOKENS: usize = 512;

#[derive(Args)]
pub struct ChatArgs {
    #[arg(long, help = crate::MODEL_HELP)]
    model: Option<String>,
    /// A system message at the start of the conversation (kept by /reset).
    #[arg(long)]
    system: Option<String>,
    /// Worker threads for the tensor kernels (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Tokens of earlier answers that suffix decoding keeps to draft from (about 16 bytes each; 0 keeps none).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SUFFIX_CACHE_TOKENS)]
    suffix_cache_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    speculation: SpeculationArgs,
    #[command(flatten)]
    load: crate::ui::LoadArgs,
}

/// The conversation's totals, for `/stats`.
#[derive(Default)]
struct Totals {
    turns: usize,
    new_tokens: usize,
    seconds: f64,
    target_forwards: usize,
    drafted: usize,
    accepted: usize,
}

impl Totals {
    fn add(&mut self, s: &GenerationStats) {
        self.turns += 1;
        self.new_tokens += s.new_tokens;
        self.seconds += s.seconds;
        self.target_forwards += s.target_forwards;
        self.drafted += s.drafted;
        self.accepted += s.accepted;
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// ` · accepted 12/30 drafts (40%)`, or ` · no drafts` under plain decoding.
fn acceptance(drafted: usize, accepted: usize) -> String {
    if drafted == 0 {
        " · no drafts".to_string()
    } else {
        format!(" · accepted {accepted}/{drafted} drafts ({:.0}%)", 100.0 * ratio(accepted as f64, drafted as f64))
    }
}

pub fn run(args: ChatArgs) -> Result<()> {
    crate::set_threads(args.threads)?;
    let mut pipe = crate::ui::load_pipeline(&args.speculation.load_spec(args.model.as_deref(), &args.load))?;
    if pipe.target.tokenizer.chat_template().is_none() {
        anyhow::bail!("this model has no chat template: use `augur generate` for plain text");
    }
    let mut options = args.sampling.options(&args.speculation);
    options.max_new_tokens = options.max_new_tokens.or(Some(CHAT_MAX_NEW_TOKENS));
    let method = args.speculation.method(&pipe)?;
    // Each answer joins the conversation's suffix cache, from which later answers that revise it draft.
    let suffix_cache =
        SuffixCacheRef { cache: Arc::new(SuffixCache::new(args.suffix_cache_tokens)), owner: String::new() };

    let cancel = Arc::new(AtomicBool::new(false));
    let answering = Arc::new(AtomicBool::new(false));
    {
        let (cancel, answering) = (Arc::clone(&cancel), Arc::clone(&answering));
        ctrlc::set_handler(move || {
            if answering.load(Ordering::Relaxed) {
                cancel.store(true, Ordering::Relaxed);
            } else {
                eprintln!("\n(/exit or Ctrl-D quits)");
            }
        })
        .context("cannot install the Ctrl-C handler")?;
    }

    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("augur chat: /reset starts over, /stats shows the totals, /exit quits; Ctrl-C stops an answer.");
    }
    let start: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::system(s.clone())).collect();
    let mut history = start.clone();
    let mut totals = Totals::default();
    let stdout = std::io::stdout();
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            print!("> ");
            stdout.lock().flush()?;
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read standard input")?;
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = start.clone();
                eprintln!("[conversation reset]");
                continue;
            }
            "/stats" => {
                let t = &totals;
                eprintln!(
                    "[{} turn{} · {} new tokens in {:.2} s ({:.1} tok/s) · {} target forwards ({:.2} tokens per forward){} · \
                     {} messages in the conversation]",
                    t.turns,
                    if t.turns == 1 { "" } else { "s" },
                    t.new_tokens,
                    t.seconds,
                    ratio(t.new_tokens as f64, t.seconds),
                    t.target_forwards,
                    ratio(t.new_tokens as f64, t.target_forwards as f64),
                    acceptance(t.drafted, t.accepted),
                    history.len()
                );
                continue;
            }
            command if command.starts_with('/') => {
                eprintln!("[unknown command {command}: /reset, /stats or /exit]");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::user(line));
        cancel.store(false, Ordering::Relaxed);
        answering.store(true, Ordering::Relaxed);
        let call = CallOptions {
            cancel: Some(Arc::clone(&cancel)),
            return_full_text: Some(false),
            method,
            suffix_cache: Some(suffix_cache.clone()),
            // Each turn's prompt is the conversation so far: only the new messages are prefilled.
            cache_prompt: Some(true),
            ..CallOptions::new(options.clone())
        };
        let mut print = |chunk: &str| {
            let mut lock = stdout.lock();
            let _ = lock.write_all(chunk.as_bytes());
            let _ = lock.flush();
        };
        let result = pipe.call(&Prompt::Chat(history.clone()), &call, Some(&mut print));
        answering.store(false, Ordering::Relaxed);
        println!();
        match result {
            Ok(out) => {
                let s = &out.stats;
                totals.add(s);
                eprintln!(
                    "[turn {} · {} prompt + {} new tokens · {:.1} tok/s · {:.2} tokens per target forward · {}{} · {}]{}",
                    totals.turns,
                    s.prompt_tokens,
                    s.new_tokens,
                    s.decode_tokens_per_s,
                    s.mean_accepted_per_forward,
                    s.method,
                    acceptance(s.drafted, s.accepted),
                    out.finish_reason.as_str(),
                    crate::ui::lossy_note(&pipe)
                );
                history.push(ChatMessage::assistant(out.text));
            }
            // A turn that cannot run (a conversation past the context, say) is dropped; the chat goes on.
            Err(e) => {
                history.pop();
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}
