//! An OpenAI-compatible HTTP server over augur's pipeline (`augur serve` runs it).
//!
//! HTTP is hyper's on tokio, under axum's router, with our accept loop for the connection cap and the deadlines
//! (`net`); generation stays on the engine's threads (`augur::engine`). Every admitted request runs as its
//! own sequence (a fork of the loaded pipeline from the engine's idle pool: shared weights, its own KV cache and
//! drafter state) on a thread of its own, which sends its text to the async handler through a channel; up to
//! `parallel` sequences run at once (the engine's admission), and the forwards they call at the same time run as one batched forward (linear layers over the rows of
//! all of them, attention per sequence; see `augur::models::batching::Batched`). Up to `queue` more wait for a slot;
//! beyond that the server answers 429. Each sequence's speculation pauses under load or when its drafts stop
//! being accepted, without changing its output.
//!
//! One concern per file: the router and its handlers (`routes`), API keys (`auth`), the checks a request passes
//! against the loaded model (`validation`), a request's engine thread (`sequence`),
//! whole and streamed answers (`streaming`), responses and errors (`reply`), what handlers share (`state`),
//! OpenAI's bodies (`api`), connections (`net`) and `/metrics` (`metrics`). This file keeps the public surface:
//! [`ServeConfig`] and [`serve`].

mod api;
mod auth;
mod metrics;
mod net;
mod reply;
mod routes;
mod sequence;
mod state;
mod streaming;
#[cfg(test)]
mod tests;
mod validation;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use augur::generation::config::GenerationOptions;
use augur::pipeline::Pipeline;
use augur::speculation::method::MethodName;
use augur::speculation::suffix_cache::DEFAULT_SUFFIX_CACHE_TOKENS;
use tokio::sync::watch;

use crate::auth::api_keys;
use crate::metrics::Metrics;
use crate::routes::router;
use crate::state::{load_server, App};

/// How the server listens, admits and speculates (the CLI fills it from `augur serve`'s flags).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The address to listen on (0.0.0.0 for every interface).
    pub host: String,
    /// 0 picks a free port; the address is printed on the first line of standard output.
    pub port: u16,
    /// The model id clients name (default: the model file or directory name).
    pub served_model_name: Option<String>,
    /// Other names a request may use for the model besides its id and path (the name it was loaded by).
    pub aliases: Vec<String>,
    /// Sequences generating at once.
    pub parallel: usize,
    /// Requests waiting for a sequence slot before the server answers 429.
    pub queue: usize,
    /// Largest request body, in bytes (beyond it, 413).
    pub max_body_bytes: usize,
    /// Open connections; beyond them a new one is answered 503 and closed.
    pub max_connections: usize,
    /// When set, every endpoint but `/health` needs `Authorization: Bearer <key>`; several keys are
    /// comma-separated (as llama-server takes them), and each key's requests have suffix decoding's cache of
    /// earlier outputs to themselves.
    pub api_key: Option<String>,
    /// Origins a browser may call from (`*`: any); empty: no CORS headers, so browsers refuse cross-origin calls.
    pub cors_origins: Vec<String>,
    /// Tokens per sequence, prompt and completion together (default and maximum: the model's context).
    pub ctx_size: Option<usize>,
    /// The most new tokens a request may ask for, and what a request that names none gets at most.
    pub max_tokens_limit: Option<usize>,
    /// After SIGTERM or SIGINT, how long in-flight requests may take; then streams end with a final error
    /// event, whole answers with 503, and the process exits.
    pub shutdown_timeout: Duration,
    /// A client must send a whole request head within this of connecting or of its previous answer (so an
    /// idle keep-alive connection closes after it too).
    pub header_timeout: Duration,
    /// A request body may pause this long between its pieces (beyond it, 408).
    pub body_timeout: Duration,
    /// A write may wait this long for the client to read before the connection is cut.
    pub write_timeout: Duration,
    /// A sequence stops drafting while more than this many sequences run (their forwards are batched then,
    /// which already shares the cost of reading the weights).
    pub speculation_max_load: usize,
    /// Each request's default speculation options; a request overrides them with its `speculation` field.
    pub speculation: GenerationOptions,
    /// The method a request that names none runs; `None`: the one `speculation`'s options or the assistant
    /// choose by Transformers' precedence, else `auto` (see `Pipeline::default_method`).
    pub speculation_method: Option<MethodName>,
    /// Tokens of earlier outputs that suffix decoding keeps, over all keys (about 16 bytes each).
    pub suffix_cache_tokens: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8080,
            served_model_name: None,
            aliases: Vec::new(),
            parallel: 4,
            queue: 16,
            max_body_bytes: 1 << 20,
            max_connections: 512,
            api_key: None,
            cors_origins: Vec::new(),
            ctx_size: None,
            max_tokens_limit: None,
            shutdown_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(15),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            speculation_max_load: 2,
            speculation: GenerationOptions::default(),
            speculation_method: None,
            suffix_cache_tokens: DEFAULT_SUFFIX_CACHE_TOKENS,
        }
    }
}

/// Listens at once, loads the model with `load` (`/health` answers 503 until it is loaded), then serves until
/// SIGTERM or SIGINT. Each request runs on a fork of the loaded pipeline. A model that fails to load ends the
/// server with that error.
pub fn serve(load: impl FnOnce() -> Result<Pipeline> + Send + 'static, config: ServeConfig) -> Result<()> {
    if config.parallel == 0 {
        anyhow::bail!("the server needs at least one parallel sequence");
    }
    if config.max_connections == 0 {
        anyhow::bail!("the server needs to accept at least one connection");
    }
    let app = Arc::new(App {
        server: OnceLock::new(),
        metrics: Metrics::default(),
        api_keys: api_keys(&config),
        deadline: watch::channel(false).0,
    });
    // The HTTP side only parses, waits and writes; two threads are plenty beside the model's.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("augur-http")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(app, config, load))?;
    // Sequences still running past the shutdown deadline are abandoned, not awaited.
    runtime.shutdown_background();
    Ok(())
}

async fn run(
    app: Arc<App>,
    config: ServeConfig,
    load: impl FnOnce() -> Result<Pipeline> + Send + 'static,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let addr = listener.local_addr()?;
    println!("augur serve: listening on http://{addr} (loading the model; /health answers 503 until it is loaded)");
    use std::io::Write;
    std::io::stdout().flush()?;
    let router = router(Arc::clone(&app), &config)?;
    let (stop, stopped) = watch::channel(false);
    let timeouts = net::Timeouts { header: config.header_timeout, write: config.write_timeout };
    let mut stopped = stopped;
    let mut serving =
        tokio::spawn(net::serve(net::Capped::new(listener, config.max_connections), router, timeouts, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }));
    let loading = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || load_server(load()?, &config))
    };
    tokio::select! {
        r = &mut serving => return r.context("the server failed"),
        () = signal() => {
            tracing::info!("stopped while the model was loading");
            return Ok(());
        }
        loaded = loading => {
            let server = Arc::new(loaded.context("the model loader panicked")??);
            let _ = app.server.set(Arc::clone(&server));
            println!("augur serve: model `{}` loaded; ready", server.model_id);
            std::io::stdout().flush()?;
        }
    }
    tokio::select! {
        r = &mut serving => return r.context("the server failed"),
        () = signal() => {}
    }
    tracing::info!("shutting down; in-flight requests have {} s to finish", config.shutdown_timeout.as_secs_f64());
    let _ = stop.send(true);
    if tokio::time::timeout(config.shutdown_timeout, &mut serving).await.is_err() {
        tracing::warn!("the shutdown deadline passed; ending the answers still running");
        let _ = app.deadline.send(true);
        // Time for those answers' last events to reach their clients.
        let _ = tokio::time::timeout(Duration::from_secs(2), serving).await;
    }
    Ok(())
}

/// SIGTERM or SIGINT.
async fn signal() {
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
