//! `augur bench`: speed of one model (prefill, decode, the cost of a k-token forward), or, with `--prompts`,
//! plain decoding against speculative methods over Spec-Bench prompts with the Spec-Bench protocol (greedy,
//! batch 1, first turn, chat template applied, the same prompts for every method, runs interleaved so that load
//! changes hit every method alike).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use augur::generation::config::GenerationOptions;
use augur::models::{CausalLm, ForwardOptions, LogitRows};
use augur::pipeline::{CallOptions, Pipeline, Prompt};
use augur::speculation::method::MethodName;
use augur::tokenizer::ChatMessage;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use crate::speculation::SpeculationArgs;

#[derive(Args)]
#[command(mut_arg("prompt_lookup_num_tokens", |a| a.default_value("10")))]
pub struct BenchArgs {
    #[arg(long, help = crate::MODEL_HELP)]
    model: Option<String>,
    /// Worker threads for the tensor kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Repetitions; the median is reported (Spec-Bench mode: per prompt and method, the methods taking turns).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Speed mode: prompt tokens of the prefill measurement (0 skips it).
    #[arg(short = 'p', long, default_value_t = 512)]
    prefill: usize,
    /// Speed mode: tokens of the decode measurement (0 skips it).
    #[arg(short = 'n', long, default_value_t = 64)]
    decode: usize,
    /// Speed mode: block sizes of the k-token forward cost curve.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    k: Vec<usize>,
    /// Speed mode: cached tokens before each block of the cost curve (attention's share grows with it).
    #[arg(long, default_value_t = 64)]
    k_context: usize,
    /// Spec-Bench mode: a question.jsonl file (`question_id`, `category`, `turns`).
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Spec-Bench mode: prompts per category.
    #[arg(long, default_value_t = 2)]
    limit: usize,
    /// Spec-Bench mode: only these categories (comma-separated).
    #[arg(long, value_delimiter = ',')]
    categories: Vec<String>,
    // The help names the registry's methods, so that it lists a new one without an edit here.
    #[arg(long, value_delimiter = ',', default_value = "prompt_lookup", help = methods_help())]
    methods: Vec<String>,
    /// Spec-Bench mode: new tokens per answer.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Spec-Bench mode: the methods' options (prompt lookup copies 10 tokens unless told otherwise).
    #[command(flatten)]
    pub(crate) speculation: SpeculationArgs,
    #[command(flatten)]
    load: crate::ui::LoadArgs,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    crate::set_threads(args.threads)?;
    let result = match &args.prompts {
        Some(p) => {
            let mut pipe = crate::ui::load_pipeline(&args.speculation.load_spec(args.model.as_deref(), &args.load))?;
            spec_bench(&mut pipe, &args, p)?
        }
        None => {
            if args.speculation.assistant_model.is_some() {
                bail!("--assistant-model is read in Spec-Bench mode (--prompts); speed mode measures the target alone");
            }
            speed(&mut crate::ui::load_pipeline(&args.load.spec(args.model.as_deref()))?, &args)?
        }
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Deterministic token ids spread over the vocabulary (like llama-bench's random prompt).
fn synthetic_tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab.min(32_000)) as u32).collect()
}

fn timed(model: &mut dyn CausalLm, tokens: &[u32], rows: LogitRows) -> Result<f64> {
    let t = Instant::now();
    model.forward(tokens, &ForwardOptions::logits(rows))?;
    Ok(t.elapsed().as_secs_f64())
}

/// The bytes of a model's weights: a GGUF file's size, or a directory's safetensors files.
fn model_bytes(path: &std::path::Path) -> u64 {
    let size = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    if !path.is_dir() {
        return size(path);
    }
    let files = std::fs::read_dir(path).into_iter().flatten().flatten().map(|e| e.path());
    files.filter(|p| p.extension().is_some_and(|e| e == "safetensors")).map(|p| size(&p)).sum()
}

/// Prefill and decode tokens per second (llama-bench's pp and tg: decode starts from an empty cache), and
/// the cost of a k-token forward relative to a one-token forward at a 64-token context.
fn speed(pipe: &mut Pipeline, args: &BenchArgs) -> Result<Value> {
    let model = pipe.target.model.as_mut();
    let vocab = model.config().vocab_size;
    let threads = rayon::current_num_threads();
    // Warm-up: page the weights in.
    model.truncate(0);
    model.forward(&synthetic_tokens(8, vocab), &ForwardOptions::logits(LogitRows::Last(1)))?;
    let mut out = json!({ "model": pipe.target.path.display().to_string(), "threads": threads });
    if args.prefill > 0 {
        let prompt = synthetic_tokens(args.prefill, vocab);
        let mut secs = Vec::new();
        for _ in 0..args.reps {
            model.truncate(0);
            secs.push(timed(model, &prompt, LogitRows::Last(1))?);
        }
        let tps = args.prefill as f64 / median(secs);
        println!("prefill  {:>5} tokens: {tps:>9.1} tok/s", args.prefill);
        out["prefill_tokens_per_s"] = json!(tps);
    }
    if args.decode > 0 {
        let tokens = synthetic_tokens(args.decode, vocab);
        let mut secs = Vec::new();
        for _ in 0..args.reps {
            model.truncate(0);
            let t = Instant::now();
            for tok in &tokens {
                model.forward(&[*tok], &ForwardOptions::logits(LogitRows::Last(1)))?;
            }
            secs.push(t.elapsed().as_secs_f64());
        }
        let tps = args.decode as f64 / median(secs);
        println!("decode   {:>5} tokens: {tps:>9.1} tok/s", args.decode);
        out["decode_tokens_per_s"] = json!(tps);
        // Decoding reads every weight once per token: the file over the read bandwidth bounds it.
        let bytes = model_bytes(&pipe.target.path);
        let bandwidth = augur::kernels::bandwidth::read_bytes_per_s(1 << 30, 3);
        let bound = bandwidth / bytes as f64;
        println!(
            "         bound: {:.2} GB per token at {:.1} GB/s read = {bound:.1} tok/s; decode at {:.0}% of it",
            bytes as f64 / 1e9,
            bandwidth / 1e9,
            100.0 * tps / bound
        );
        out["model_bytes"] = json!(bytes);
        out["read_bytes_per_s"] = json!(bandwidth);
        out["decode_share_of_bound"] = json!(tps / bound);
    }
    if !args.k.is_empty() {
        if args.k.contains(&0) {
            bail!("--k values must be at least 1");
        }
        let context = synthetic_tokens(args.k_context, vocab);
        let ks: Vec<usize> = std::iter::once(1).chain(args.k.iter().copied().filter(|&k| k != 1)).collect();
        let blocks: Vec<Vec<u32>> = ks.iter().map(|&k| synthetic_tokens(k, vocab)).collect();
        model.truncate(0);
        model.forward(&context, &ForwardOptions::logits(LogitRows::None))?;
        // As in a speculative round: the block is verified, then cut back. The block sizes take turns within
        // each repetition, so that a slower or faster spell of the machine weighs on all of them alike; one
        // warm-up round first, then enough repetitions for a stable median of a millisecond-scale operation.
        let mut secs = vec![Vec::new(); ks.len()];
        for rep in 0..=args.reps.max(9) {
            for (i, block) in blocks.iter().enumerate() {
                model.truncate(context.len());
                let s = timed(model, block, LogitRows::Last(block.len()))?;
                if rep > 0 {
                    secs[i].push(s);
                }
            }
        }
        let mut curve = BTreeMap::new();
        let base = median(secs[0].clone());
        for (k, s) in ks.iter().zip(secs) {
            let s = median(s);
            println!(
                "forward k={k:<2} at context {}: {:>8.2} ms = {:.2}x a one-token forward",
                context.len(),
                s * 1e3,
                s / base
            );
            curve.insert(k.to_string(), json!({ "seconds": s, "relative": s / base }));
        }
        out["k_cost"] = json!(curve);
    }
    model.truncate(0);
    Ok(out)
}

#[derive(Debug, Clone, Serialize)]
struct Run {
    question_id: u64,
    category: String,
    method: String,
    /// The drafter that ran (the stats' method): `assistant_model` runs as `universal_assisted` when the
    /// assistant's tokenizer differs from the target's.
    ran: String,
    new_tokens: usize,
    seconds: f64,
    /// The first target forward (the prompt, plus the first drafts under speculation).
    prefill_seconds: f64,
    target_forwards: usize,
    drafted: usize,
    accepted: usize,
    /// Greedy tokens identical to plain decoding's on this prompt.
    same_as_plain: bool,
}

#[derive(Debug, Default, Clone, Serialize)]
struct Summary {
    prompts: usize,
    /// The drafters that ran, comma-separated.
    ran: String,
    new_tokens: usize,
    seconds: f64,
    target_forwards: usize,
    drafted: usize,
    accepted: usize,
    tokens_per_s: f64,
    mean_accepted_per_forward: f64,
    acceptance_rate: f64,
    speedup: f64,
    /// The speedup once the target has read the prompt: plain decoding's seconds after its prefill, over this
    /// method's seconds minus that same prefill (which every method pays), summed over the prompts.
    decode_speedup: f64,
    /// Seconds after plain decoding's prefill, summed (for `decode_speedup`).
    #[serde(skip)]
    after_prefill: f64,
    /// Plain decoding's seconds after its prefill over this method's seconds after its own first forward,
    /// summed over the prompts: what drafting buys with the prefill's run-to-run spread (±5–10% on long prompts,
    /// most of the difference on short answers) taken off. The first forward of a speculative run may carry a
    /// probe's few drafts, which this counts as prefill.
    decode_only_speedup: f64,
    #[serde(skip)]
    after_own_prefill: f64,
    identical_to_plain: usize,
}

/// `--methods`' help, with the registry's method names.
fn methods_help() -> String {
    format!(
        "Spec-Bench mode: methods compared with plain decoding, of {} (`<method>_tree`: with tree drafts, see the \
         `--speculative-*` flags; `<method>_full_head`: the assistant drafting from its whole LM head). assistant_model runs universal assisted decoding when the assistant's tokenizer \
         differs; early_exit needs --assistant-early-exit. Suffix decoding reads each answer's own prompt and \
         output only: a cache of earlier answers would hold the repetitions' own.",
        augur::speculation::registry::METHODS.as_str()
    )
}

/// A method's call: named, so that the flags of the other methods (and the attached assistant) leave it alone.
fn method_options(args: &BenchArgs, method: &str) -> Result<CallOptions> {
    let spec = &args.speculation;
    let base = GenerationOptions {
        max_new_tokens: Some(args.max_new_tokens),
        do_sample: Some(false),
        cost_aware_drafting: spec.cost_aware_drafting,
        ..Default::default()
    };
    // `<method>_full_head` drafts from the assistant's whole LM head (`draft_vocab_size` 0), beside the same
    // method on its reduced draft vocabulary.
    let (method, full_head) = match method.strip_suffix("_full_head") {
        Some(m) => (m, true),
        None => (method, false),
    };
    // `<method>_tree` is the method with tree drafts (`--speculative-eagle-topk`, 3 unless given); the method's
    // own name drafts chains whatever the tree flags say.
    let (method, tree) = match method.strip_suffix("_tree") {
        Some(m) => (m, true),
        None => (method, false),
    };
    let name = match method {
        "plain" if tree => bail!("--methods: plain decoding has no tree form"),
        "plain" => MethodName::Plain,
        "assistant_model" if spec.assistant_model.is_none() => {
            bail!("the assistant_model method needs --assistant-model")
        }
        "early_exit" if spec.assistant_early_exit.is_none() => {
            bail!("the early_exit method needs --assistant-early-exit L")
        }
        m => m.parse().map_err(|e| anyhow!("--methods: {e}"))?,
    };
    let mut o = name.own_options(&spec.options())?;
    o.merge(&base);
    if full_head {
        let reads_head = name.method().is_some_and(|m| m.each_knob().any(|k| k.name == "draft_vocab_size"));
        if !reads_head {
            bail!("--methods: {name} drafts from no assistant's head, so it has no _full_head form");
        }
        if spec.draft_vocab_size.is_some() {
            bail!("--methods: {name}_full_head drafts from the whole head, which --draft-vocab-size contradicts");
        }
        o.draft_vocab_size = Some(0);
    }
    if tree {
        o.speculative_eagle_topk = Some(spec.speculative_eagle_topk.unwrap_or(3));
    } else {
        (o.speculative_eagle_topk, o.speculative_num_draft_tokens, o.speculative_num_steps) = (None, None, None);
    }
    Ok(CallOptions { method: Some(name), ..CallOptions::new(o) })
}

/// Flags that only one method reads, given without that method, would be silently ignored.
fn check_method_flags(args: &BenchArgs) -> Result<()> {
    let has = |m: &str| args.methods.iter().any(|x| x == m);
    if args.speculation.assistant_early_exit.is_some() && !has("early_exit") {
        bail!("--assistant-early-exit is read by the early_exit method only: add it to --methods");
    }
    let tree_flags = [
        args.speculation.speculative_eagle_topk,
        args.speculation.speculative_num_draft_tokens,
        args.speculation.speculative_num_steps,
    ];
    if tree_flags.iter().any(Option::is_some) && !args.methods.iter().any(|m| m.ends_with("_tree")) {
        bail!("the --speculative-* tree flags are read by tree methods only: add prompt_lookup_tree or assistant_model_tree to --methods");
    }
    if args.speculation.use_mtp && !has("mtp") {
        bail!("--use-mtp: compare multi-token prediction with --methods mtp");
    }
    if args.speculation.speculation.is_some() {
        bail!("--speculation names one method: bench compares the methods of --methods");
    }
    let s = &args.speculation;
    let suffix_flags =
        [s.suffix_max_depth.is_some(), s.suffix_max_spec_factor.is_some(), s.suffix_min_token_prob.is_some()];
    if (suffix_flags.contains(&true) || s.suffix_global_cache.is_some()) && !has("suffix") && !has("auto") {
        bail!("the --suffix-* flags are read by suffix decoding only: add suffix or auto to --methods");
    }
    Ok(())
}

/// The first `limit` first-turn prompts of each category, in file order.
fn load_prompts(path: &PathBuf, limit: usize, categories: &[String]) -> Result<Vec<(u64, String, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut per_category: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let field = |name: &str| v.get(name).with_context(|| format!("{}:{}: no `{name}`", path.display(), i + 1));
        let category = field("category")?.as_str().context("`category` is not a string")?.to_string();
        let turn = field("turns")?.get(0).and_then(Value::as_str).context("`turns[0]` is not a string")?;
        let id = field("question_id")?.as_u64().context("`question_id` is not an integer")?;
        if !categories.is_empty() && !categories.contains(&category) {
            continue;
        }
        let n = per_category.entry(category.clone()).or_default();
        if *n < limit {
            *n += 1;
            out.push((id, category, turn.to_string()));
        }
    }
    if out.is_empty() {
        bail!("{}: no prompts selected", path.display());
    }
    Ok(out)
}

fn spec_bench(pipe: &mut Pipeline, args: &BenchArgs, path: &PathBuf) -> Result<Value> {
    check_method_flags(args)?;
    let prompts = load_prompts(path, args.limit, &args.categories)?;
    let mut methods = vec!["plain".to_string()];
    methods.extend(args.methods.iter().filter(|m| *m != "plain").cloned());
    let options: Vec<CallOptions> = methods.iter().map(|m| method_options(args, m)).collect::<Result<_>>()?;
    // Warm-up on the first prompt (pages the weights in), not timed.
    let warm = Prompt::Chat(vec![ChatMessage::user(prompts[0].2.clone())]);
    let mut warm_up = options[0].clone();
    warm_up.generation.max_new_tokens = Some(8);
    pipe.call(&warm, &warm_up, None)?;

    let mut runs = Vec::new();
    let mut rendered = Vec::new();
    for (id, category, text) in &prompts {
        let messages = vec![ChatMessage::user(text.clone())];
        rendered.push(json!({
            "question_id": id,
            "category": category,
            "text": pipe.target.tokenizer.apply_chat_template(&messages, true)?,
        }));
        let ids = pipe.encode(&Prompt::Chat(messages), true)?;
        // Each repetition runs every method in turn, so that a slow spell of the machine reaches them alike;
        // each (prompt, method) then reports its median run.
        let mut reps: Vec<Vec<Run>> = vec![Vec::new(); methods.len()];
        let mut plain_tokens = Vec::new();
        for _ in 0..args.reps {
            for (i, (method, opts)) in methods.iter().zip(&options).enumerate() {
                let out = pipe.call_ids(&ids, opts, None)?;
                if method == "plain" && plain_tokens.is_empty() {
                    plain_tokens = out.tokens.clone();
                }
                let s = &out.stats;
                eprintln!(
                    "{id:>4} {category:<14} {method:<16} {:>4} tokens {:>7.2} s {:>6.1} tok/s {:>5.2} tok/forward ({})",
                    s.new_tokens, s.seconds, s.tokens_per_s, s.mean_accepted_per_forward, s.method
                );
                reps[i].push(Run {
                    question_id: *id,
                    category: category.clone(),
                    method: method.clone(),
                    ran: s.method.clone(),
                    new_tokens: s.new_tokens,
                    seconds: s.seconds,
                    prefill_seconds: s.prefill_seconds,
                    target_forwards: s.target_forwards,
                    drafted: s.drafted,
                    accepted: s.accepted,
                    same_as_plain: out.tokens == plain_tokens,
                });
            }
        }
        runs.extend(reps.into_iter().map(median_run));
    }

    let summaries = summarize(&runs);
    print_table(&methods, &summaries);
    Ok(json!({
        "model": pipe.target.path.display().to_string(),
        "assistant_model": args.speculation.assistant_model,
        "assistant_tokenizer": args.speculation.assistant_tokenizer,
        "assistant_early_exit": args.speculation.assistant_early_exit,
        "threads": rayon::current_num_threads(),
        "max_new_tokens": args.max_new_tokens,
        "limit_per_category": args.limit,
        "reps": args.reps,
        "summary": summaries,
        "runs": runs,
        "prompts": rendered,
    }))
}

/// The run of median seconds (the lower middle one of an even count); identical to plain only if every
/// repetition was.
fn median_run(mut reps: Vec<Run>) -> Run {
    let same = reps.iter().all(|r| r.same_as_plain);
    reps.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut run = reps.swap_remove((reps.len() - 1) / 2);
    run.same_as_plain = same;
    run
}

/// Per category (and `overall`) and method.
fn summarize(runs: &[Run]) -> BTreeMap<String, BTreeMap<String, Summary>> {
    let mut out: BTreeMap<String, BTreeMap<String, Summary>> = BTreeMap::new();
    let plain_prefill: HashMap<u64, f64> =
        runs.iter().filter(|r| r.method == "plain").map(|r| (r.question_id, r.prefill_seconds)).collect();
    for r in runs {
        let prefill = plain_prefill.get(&r.question_id).copied().unwrap_or(0.0);
        for cat in [r.category.as_str(), "overall"] {
            let s = out.entry(cat.to_string()).or_default().entry(r.method.clone()).or_default();
            s.prompts += 1;
            if !s.ran.split(',').any(|m| m == r.ran) {
                if !s.ran.is_empty() {
                    s.ran.push(',');
                }
                s.ran.push_str(&r.ran);
            }
            s.new_tokens += r.new_tokens;
            s.seconds += r.seconds;
            s.after_prefill += r.seconds - prefill;
            s.after_own_prefill += r.seconds - r.prefill_seconds;
            s.target_forwards += r.target_forwards;
            s.drafted += r.drafted;
            s.accepted += r.accepted;
            s.identical_to_plain += usize::from(r.same_as_plain);
        }
    }
    for methods in out.values_mut() {
        let plain_rate = methods.get("plain").map(|p| p.new_tokens as f64 / p.seconds).unwrap_or(f64::NAN);
        let plain_after = methods.get("plain").map(|p| p.after_prefill).unwrap_or(f64::NAN);
        let plain_own = methods.get("plain").map(|p| p.after_own_prefill).unwrap_or(f64::NAN);
        for s in methods.values_mut() {
            s.decode_speedup = plain_after / s.after_prefill;
            s.decode_only_speedup = plain_own / s.after_own_prefill;
            s.tokens_per_s = s.new_tokens as f64 / s.seconds;
            s.mean_accepted_per_forward = s.new_tokens as f64 / s.target_forwards.max(1) as f64;
            s.acceptance_rate = if s.drafted > 0 { s.accepted as f64 / s.drafted as f64 } else { 0.0 };
            s.speedup = s.tokens_per_s / plain_rate;
        }
    }
    out
}

fn print_table(methods: &[String], summaries: &BTreeMap<String, BTreeMap<String, Summary>>) {
    println!(
        "| category | method | ran as | prompts | tok/s | speedup | after the prompt | decode only | tokens/forward | acceptance \
             | identical to plain |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let overall = "overall".to_string();
    let order = summaries.keys().filter(|k| **k != overall).chain(std::iter::once(&overall));
    for cat in order {
        for m in methods {
            if let Some(s) = summaries.get(cat).and_then(|c| c.get(m)) {
                println!(
                    "| {cat} | {m} | {} | {} | {:.1} | {:.2}x | {:.2}x | {:.2}x | {:.2} | {:.0}% | {}/{} |",
                    s.ran,
                    s.prompts,
                    s.tokens_per_s,
                    s.speedup,
                    s.decode_speedup,
                    s.decode_only_speedup,
                    s.mean_accepted_per_forward,
                    100.0 * s.acceptance_rate,
                    s.identical_to_plain,
                    s.prompts
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn args(extra: &[&str]) -> BenchArgs {
        let argv =
            ["augur", "bench", "--prompts=q.jsonl", "--max-new-tokens=7"].into_iter().chain(extra.iter().copied());
        match Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}")).command {
            Command::Bench(a) => a,
            _ => unreachable!(),
        }
    }

    /// `--methods`' help names every method of the registry.
    #[test]
    fn the_methods_help_names_every_registered_method() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let bench = cli.find_subcommand_mut("bench").expect("bench");
        let arg = bench.get_arguments().find(|a| a.get_id() == "methods").expect("--methods");
        let help = arg.get_help().expect("help").to_string();
        for m in augur::speculation::registry::REGISTRY {
            assert!(help.contains(m.name), "--methods' help lacks {}: {help}", m.name);
        }
    }

    #[test]
    fn a_full_head_variant_drafts_from_the_whole_head_and_only_for_an_assistant() {
        let a = args(&["--methods=assistant_model_full_head,assistant_model", "--assistant-model=a"]);
        let full = method_options(&a, "assistant_model_full_head").unwrap();
        let assistant = "assistant_model".parse::<MethodName>().unwrap();
        assert_eq!((full.method, full.generation.draft_vocab_size), (Some(assistant), Some(0)));
        assert_eq!(method_options(&a, "assistant_model").unwrap().generation.draft_vocab_size, None);
        assert_eq!(method_options(&a, "auto_full_head").unwrap().generation.draft_vocab_size, Some(0));
        let lookup = method_options(&a, "prompt_lookup_full_head").unwrap_err();
        assert!(lookup.to_string().contains("no _full_head form"), "{lookup}");
        let both = args(&["--assistant-model=a", "--draft-vocab-size=100"]);
        assert!(method_options(&both, "assistant_model_full_head").is_err());
    }

    #[test]
    fn early_exit_method_needs_its_layer_count_and_the_other_way_round() {
        let a = args(&["--methods=early_exit", "--assistant-early-exit=4", "--num-assistant-tokens=3"]);
        check_method_flags(&a).unwrap();
        let call = method_options(&a, "early_exit").unwrap();
        let o = &call.generation;
        assert_eq!(call.method, Some(MethodName::EarlyExit));
        assert_eq!((o.assistant_early_exit, o.num_assistant_tokens), (Some(4), Some(3)));
        assert_eq!((o.max_new_tokens, o.do_sample, o.prompt_lookup_num_tokens), (Some(7), Some(false), None));
        let plain = method_options(&a, "plain").unwrap();
        assert_eq!(plain.method, Some(MethodName::Plain));
        assert_eq!((plain.generation.assistant_early_exit, plain.generation.num_assistant_tokens), (None, None));
        let missing = method_options(&args(&["--methods=early_exit"]), "early_exit").unwrap_err();
        assert!(missing.to_string().contains("--assistant-early-exit"), "{missing}");
        let unused = check_method_flags(&args(&["--assistant-early-exit=4"])).unwrap_err();
        assert!(unused.to_string().contains("--methods"), "{unused}");
        assert!(check_method_flags(&args(&["--use-mtp"])).is_err());
        assert!(method_options(&args(&[]), "assistant_model").is_err());
    }
}
