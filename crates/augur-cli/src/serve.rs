//! `augur serve`: its flags, and a call into `augur-server`.

use anyhow::{Context, Result};
use augur::speculation::suffix_cache::DEFAULT_SUFFIX_CACHE_TOKENS;
use augur_server::ServeConfig;
use clap::{Args, ValueEnum};
use std::io::IsTerminal;

use crate::speculation::SpeculationArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logs at INFO to standard error (colours only on a terminal).
fn init_logs(format: LogFormat) -> Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot set up the request log: {e}"))
}

#[derive(Args)]
#[command(after_help = "The speculation flags, as for `generate`, set each request's default speculation; a request \
                       overrides it with its `speculation` field.")]
pub struct ServeArgs {
    #[arg(long, help = crate::MODEL_HELP)]
    model: Option<String>,
    /// The address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the address is printed on the first line of standard output.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model id clients name (default: the model file or directory name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Sequences generating at once.
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Requests waiting for a sequence slot before the server answers 429.
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Open connections; beyond them a new one is answered 503 and closed.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Require `Authorization: Bearer <KEY>` on every endpoint but `/health`; several keys comma-separated, each
    /// with suffix decoding's cache of earlier outputs to itself.
    #[arg(long, conflicts_with = "api_key_file")]
    api_key: Option<String>,
    /// Read the API key from this file (its first line), so that it stays out of the process list.
    #[arg(long)]
    api_key_file: Option<std::path::PathBuf>,
    /// Origins browsers may call the API from, comma-separated (`*`: any origin). None by default, so
    /// browsers refuse cross-origin calls.
    #[arg(long, value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// Tokens per sequence, prompt and completion together (default: the model's context); a request beyond
    /// it gets 400 `context_length_exceeded`. It also bounds each sequence's KV cache.
    #[arg(long)]
    ctx_size: Option<usize>,
    /// The most new tokens a request may ask for (`max_tokens`); a request that names none gets at most this.
    #[arg(long)]
    max_tokens_limit: Option<usize>,
    /// Seconds in-flight requests have to finish after SIGTERM or SIGINT; then streams still running end with
    /// a final error event, whole answers with 503, and the server exits 0.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Seconds a client has to send a whole request head, from connecting or from its previous answer (an idle
    /// keep-alive connection closes after it too).
    #[arg(long, default_value_t = 15.0)]
    header_timeout: f64,
    /// Seconds a request body may pause between its pieces (beyond it, 408).
    #[arg(long, default_value_t = 30.0)]
    body_timeout: f64,
    /// Seconds a write may wait for the client to read before the connection is cut.
    #[arg(long, default_value_t = 30.0)]
    write_timeout: f64,
    /// A sequence stops drafting while more than this many sequences run (their forwards are batched then,
    /// which already shares the cost of reading the weights).
    #[arg(long, default_value_t = 2)]
    speculation_max_load: usize,
    /// Tokens of earlier answers that suffix decoding keeps to draft from, over all API keys (about 16 bytes
    /// each; the least recently used answer goes first; 0 keeps none).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SUFFIX_CACHE_TOKENS)]
    suffix_cache_tokens: usize,
    /// The request log on standard error: one line per request (method, path, status, tokens, speculation,
    /// latency) as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Worker threads for the tensor kernels (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    pub(crate) speculation: SpeculationArgs,
    #[command(flatten)]
    load: crate::ui::LoadArgs,
}

pub fn serve(args: ServeArgs) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    let seconds = |flag: &str, v: f64| {
        std::time::Duration::try_from_secs_f64(v)
            .map_err(|_| anyhow::anyhow!("--{flag} must be a non-negative number of seconds, not {v}"))
    };
    let shutdown_timeout = seconds("shutdown-timeout", args.shutdown_timeout)?;
    let header_timeout = seconds("header-timeout", args.header_timeout)?;
    let body_timeout = seconds("body-timeout", args.body_timeout)?;
    let write_timeout = seconds("write-timeout", args.write_timeout)?;
    let api_key = match &args.api_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the API key file {}", path.display()))?;
            let key = text.lines().next().unwrap_or_default().trim().to_string();
            if key.is_empty() {
                anyhow::bail!("the API key file {} is empty", path.display());
            }
            Some(key)
        }
        None => args.api_key.clone(),
    };
    if api_key.as_ref().is_some_and(|k| k.is_empty()) {
        anyhow::bail!("--api-key must not be empty");
    }
    crate::set_threads(args.threads)?;
    init_logs(args.log_format)?;
    let config = ServeConfig {
        host: args.host,
        port: args.port,
        served_model_name: args.served_model_name,
        aliases: args.model.clone().into_iter().collect(),
        parallel: args.parallel,
        queue: args.queue,
        max_body_bytes: args.max_body_bytes,
        max_connections: args.max_connections,
        api_key,
        cors_origins: args.cors_origins,
        ctx_size: args.ctx_size,
        max_tokens_limit: args.max_tokens_limit,
        shutdown_timeout,
        header_timeout,
        body_timeout,
        write_timeout,
        speculation_max_load: args.speculation_max_load,
        speculation: args.speculation.options(),
        speculation_method: args.speculation.named()?,
        suffix_cache_tokens: args.suffix_cache_tokens,
    };
    let (model, speculation, load) = (args.model, args.speculation, args.load);
    augur_server::serve(move || crate::ui::load_pipeline(&speculation.load_spec(model.as_deref(), &load)), config)
}
