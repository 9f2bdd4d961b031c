//! What the handlers share: the loaded model and what requests need of it ([`Server`]), and the server
//! before it is loaded ([`App`]).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Result;
use augur::engine::Engine;
use augur::generation::config::GenerationOptions;
use augur::pipeline::Pipeline;
use augur::speculation::method::MethodName;
use augur::speculation::suffix_cache::SuffixCache;
use augur::tokenizer::Tokenizer;
use tokio::sync::watch;

use crate::api::ApiError;
use crate::metrics::Metrics;
use crate::ServeConfig;

/// The loaded model and what requests need of it.
pub(crate) struct Server {
    pub(crate) model_id: String,
    /// Other names a request may use for the model (its path, the name it was loaded by).
    pub(crate) aliases: Vec<String>,
    /// Admission, and the idle sequences kept with their caches, which a request that begins as their last
    /// one did reuses (`cache_prompt`).
    pub(crate) engine: Engine,
    pub(crate) tokenizer: Arc<Tokenizer>,
    /// Tokens per sequence: the model's context, or `--ctx-size` below it.
    pub(crate) context: usize,
    /// The model's end-of-sequence ids, which `stop_token_ids` join.
    pub(crate) eos: Vec<u32>,
    /// The model's generation defaults (its `generation_config.json`), which a request's omitted sampling fields
    /// take (see [`crate::validation::sampling_defaults`]).
    pub(crate) model_defaults: GenerationOptions,
    pub(crate) max_tokens_limit: Option<usize>,
    pub(crate) has_assistant: bool,
    /// The default speculation options, and the method a request that names none runs.
    pub(crate) speculation: GenerationOptions,
    pub(crate) default_method: Option<MethodName>,
    /// Earlier outputs, for suffix decoding (per key).
    pub(crate) suffix_cache: Arc<SuffixCache>,
    pub(crate) speculation_max_load: usize,
    pub(crate) next_id: AtomicU64,
    pub(crate) started: u64,
}

/// What every handler shares: the model once it is loaded, and what the server does before that.
pub(crate) struct App {
    pub(crate) server: OnceLock<Arc<Server>>,
    pub(crate) metrics: Metrics,
    /// The keys a request may present; empty: none needed.
    pub(crate) api_keys: Vec<String>,
    /// Turns true when the shutdown deadline passes: answers still running end then.
    pub(crate) deadline: watch::Sender<bool>,
}

impl App {
    /// The loaded model, or the 503 a client gets while it loads.
    pub(crate) fn ready(&self) -> Result<&Arc<Server>, ApiError> {
        self.server.get().ok_or_else(|| {
            ApiError::bad("the model is still loading; retry when GET /health answers 200").with(
                503,
                "server_error",
                "model_loading",
            )
        })
    }
}

pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn load_server(pipe: Pipeline, config: &ServeConfig) -> Result<Server> {
    let path = pipe.target.path.clone();
    let model_id = config.served_model_name.clone().unwrap_or_else(|| {
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
    });
    let model_context = pipe.target.config().max_position_embeddings;
    let context = match config.ctx_size {
        Some(0) => anyhow::bail!("--ctx-size must be at least 1"),
        Some(c) if c > model_context => {
            anyhow::bail!("--ctx-size {c} is beyond the model's context of {model_context} tokens")
        }
        Some(c) => c,
        None => model_context,
    };
    let default_method = pipe.default_method(config.speculation_method, &config.speculation);
    Ok(Server {
        aliases: config.aliases.iter().cloned().chain([path.display().to_string()]).collect(),
        model_id,
        tokenizer: Arc::clone(&pipe.target.tokenizer),
        context,
        eos: pipe.resolve_config(&config.speculation).eos_token_id,
        model_defaults: {
            let mut o = pipe.target.defaults.clone();
            o.merge(&pipe.defaults);
            o
        },
        max_tokens_limit: config.max_tokens_limit,
        has_assistant: pipe.assistant.is_some(),
        speculation: config.speculation.clone(),
        default_method,
        suffix_cache: Arc::new(SuffixCache::new(config.suffix_cache_tokens)),
        speculation_max_load: config.speculation_max_load,
        next_id: AtomicU64::new(1),
        started: now(),
        engine: Engine::new(pipe, config.parallel, config.queue)?,
    })
}

pub(crate) type Shared = Arc<App>;
