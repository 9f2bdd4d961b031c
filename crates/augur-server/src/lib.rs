//! An OpenAI-compatible HTTP server over augur's pipeline (`augur serve` runs it).
//!
//! HTTP is hyper's on tokio, under axum's router, with our accept loop for the connection cap and the deadlines
//! (`net`); generation stays on the engine's threads. Every admitted request runs as its
//! own sequence (a fork of the loaded pipeline: shared weights, its own KV cache and drafter state) on a thread
//! of its own, which sends its text to the async handler through a channel; up to `parallel` sequences run at
//! once, and the forwards they call at the same time run as one batched forward (linear layers over the rows of
//! all of them, attention per sequence; see `augur::batching::Batched`). Up to `queue` more wait for a slot;
//! beyond that the server answers 429. Each sequence's speculation pauses under load or when its drafts stop
//! being accepted, without changing its output.

mod api;
mod metrics;
mod net;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use augur::generation::config::GenerationOptions;
use augur::generation::output::{GenerationOutput, TokenLogprob};
use augur::generation::stopping::FinishReason;
use augur::pipeline::{CallOptions, Pipeline, Prompt, Sinks};
use augur::speculation::method::MethodName;
use augur::speculation::suffix_cache::{SuffixCache, SuffixCacheRef, DEFAULT_SUFFIX_CACHE_TOKENS};
use augur::speculation::BackoffPolicy;
use augur::tokenizer::Tokenizer;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use axum::Router;
use serde_json::json;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;

use api::{ApiError, CompletionRequest, Meta, Speculation};
use metrics::Metrics;

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

/// Admission, first come first served: at most `slots` sequences run, at most `queue` requests wait, and they
/// are admitted in the order they came (a request for `n` choices is not passed by later smaller ones).
struct Scheduler {
    slots: usize,
    queue: usize,
    state: Mutex<Admission>,
    freed: Condvar,
    /// Running sequences, read by every sequence's back-off policy.
    running: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct Admission {
    running: usize,
    waiting: usize,
    /// The ticket the next request to arrive takes, and the ticket admitted next.
    next_ticket: u64,
    serving: u64,
}

/// `n` slots, given back on drop.
struct Permit<'a>(&'a Scheduler, usize);

impl Scheduler {
    fn new(slots: usize, queue: usize) -> Self {
        Scheduler {
            slots,
            queue,
            state: Mutex::new(Admission::default()),
            freed: Condvar::new(),
            running: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn state(&self) -> MutexGuard<'_, Admission> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `n` slots at once (a request's choices start together, and no request holds slots while it
    /// waits for more) behind every request that came earlier, or returns `None` at once when the queue is
    /// full. `n` is at most `slots`.
    fn admit(&self, n: usize) -> Option<Permit<'_>> {
        let mut s = self.state();
        let first = s.serving == s.next_ticket;
        if !(first && s.running + n <= self.slots) && s.waiting >= self.queue {
            return None;
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting += 1;
        while s.serving != ticket || s.running + n > self.slots {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.waiting -= 1;
        s.serving += 1;
        s.running += n;
        self.running.store(s.running, Ordering::Relaxed);
        // The next in line may fit too.
        self.freed.notify_all();
        Some(Permit(self, n))
    }

    /// (running, waiting)
    fn gauges(&self) -> (usize, usize) {
        let s = self.state();
        (s.running, s.waiting)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.running -= self.1;
        self.0.running.store(s.running, Ordering::Relaxed);
        self.0.freed.notify_all();
    }
}

/// The loaded model and what requests need of it.
struct Server {
    model_id: String,
    /// Other names a request may use for the model (its path, the name it was loaded by).
    aliases: Vec<String>,
    template: Mutex<Pipeline>,
    /// Idle sequences (forks of `template`) kept with their cache buffers.
    idle: Mutex<Vec<Pipeline>>,
    tokenizer: Arc<Tokenizer>,
    /// Tokens per sequence: the model's context, or `--ctx-size` below it.
    context: usize,
    /// The model's end-of-sequence ids, which `stop_token_ids` join.
    eos: Vec<u32>,
    /// The model's generation defaults (its `generation_config.json`), which a request's omitted sampling fields
    /// take (see [`sampling_defaults`]).
    model_defaults: GenerationOptions,
    max_tokens_limit: Option<usize>,
    has_assistant: bool,
    /// The default speculation options, and the method a request that names none runs.
    speculation: GenerationOptions,
    default_method: Option<MethodName>,
    /// Earlier outputs, for suffix decoding (per key).
    suffix_cache: Arc<SuffixCache>,
    speculation_max_load: usize,
    scheduler: Scheduler,
    next_id: AtomicU64,
    started: u64,
}

impl Server {
    /// A request's `model`, when it names one, must be this server's (its id, path or the name it was loaded by).
    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.model_id && !self.aliases.iter().any(|a| a == m) => Err(ApiError::param(
                "model",
                format!("The model `{m}` does not exist (this server has `{}`)", self.model_id),
            )
            .with(404, "invalid_request_error", "model_not_found")),
            _ => Ok(()),
        }
    }

    /// Every id of `ids` must be a token of the tokenizer (an embedding row past its vocabulary is padding, no
    /// token); the first one that is not is refused, naming `param(i)`.
    fn check_vocabulary(&self, ids: &[u32], param: impl Fn(usize) -> String) -> Result<(), ApiError> {
        let tokens = self.tokenizer.vocab_size();
        match ids.iter().position(|&t| t as usize >= tokens || self.tokenizer.id_to_token(t).is_none()) {
            Some(i) => Err(ApiError::param(
                param(i),
                format!("token id {} is no token of the model's vocabulary of {tokens} tokens", ids[i]),
            )),
            None => Ok(()),
        }
    }
}

/// What every handler shares: the model once it is loaded, and what the server does before that.
struct App {
    server: OnceLock<Arc<Server>>,
    metrics: Metrics,
    /// The keys a request may present; empty: none needed.
    api_keys: Vec<String>,
    /// Turns true when the shutdown deadline passes: answers still running end then.
    deadline: watch::Sender<bool>,
}

impl App {
    /// The loaded model, or the 503 a client gets while it loads.
    fn ready(&self) -> Result<&Arc<Server>, ApiError> {
        self.server.get().ok_or_else(|| {
            ApiError::bad("the model is still loading; retry when GET /health answers 200").with(
                503,
                "server_error",
                "model_loading",
            )
        })
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn load_server(pipe: Pipeline, config: &ServeConfig) -> Result<Server> {
    // The first sequence, forked now so that a model that cannot be forked fails at start, not per request.
    let first = pipe.fork()?;
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
        idle: Mutex::new(vec![first]),
        template: Mutex::new(pipe),
        speculation: config.speculation.clone(),
        default_method,
        suffix_cache: Arc::new(SuffixCache::new(config.suffix_cache_tokens)),
        speculation_max_load: config.speculation_max_load,
        scheduler: Scheduler::new(config.parallel, config.queue),
        next_id: AtomicU64::new(1),
        started: now(),
    })
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

type Shared = Arc<App>;

fn cors(origins: &[String]) -> Result<CorsLayer> {
    let layer = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
        .max_age(Duration::from_secs(3600));
    if origins.iter().any(|o| o == "*") {
        return Ok(layer.allow_origin(AllowOrigin::any()));
    }
    let list = origins
        .iter()
        .map(|o| {
            header::HeaderValue::from_str(o).with_context(|| format!("--cors-origins: `{o}` is not a valid origin"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(layer.allow_origin(list))
}

fn router(app: Shared, config: &ServeConfig) -> Result<Router> {
    let mut router = Router::new()
        .route("/health", get(health).fallback(not_allowed))
        .route("/v1/models", get(models).fallback(not_allowed))
        .route("/metrics", get(metrics_text).fallback(not_allowed))
        .route("/tokenize", post(tokenize).fallback(not_allowed))
        .route("/detokenize", post(detokenize).fallback(not_allowed))
        .route("/v1/completions", post(completions).fallback(not_allowed))
        .route("/v1/chat/completions", post(chat_completions).fallback(not_allowed))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(config.max_body_bytes))
        .layer(RequestBodyTimeoutLayer::new(config.body_timeout))
        .layer(middleware::from_fn_with_state(Arc::clone(&app), guard));
    // Outside the key check, so that a browser's preflight (which carries no key) is answered.
    if !config.cors_origins.is_empty() {
        router = router.layer(cors(&config.cors_origins)?);
    }
    Ok(router.with_state(app))
}

fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], e.body()).into_response()
}

fn json_reply(v: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Compares in time that depends only on the lengths, so that a client cannot find the key byte by byte from
/// how long the refusals take.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The keys of `--api-key`, comma-separated.
fn api_keys(config: &ServeConfig) -> Vec<String> {
    let keys = config.api_key.iter().flat_map(|k| k.split(','));
    keys.map(str::trim).filter(|k| !k.is_empty()).map(String::from).collect()
}

/// Which of `keys` the request presents (every key compared, in constant time each).
fn presented_key(headers: &HeaderMap, keys: &[String]) -> Option<usize> {
    let value = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())?;
    let (scheme, token) = value.split_once(' ')?;
    let matches: Vec<bool> = keys.iter().map(|k| constant_time_eq(token.trim().as_bytes(), k.as_bytes())).collect();
    scheme.eq_ignore_ascii_case("bearer").then(|| matches.iter().position(|&m| m)).flatten()
}

/// Whose request it is, for what the server keeps per key (suffix decoding's cache): the key's place in the
/// list, never the key itself; empty when the server needs no key.
#[derive(Clone, Debug, Default)]
struct Owner(String);

/// Marks a generation's response: its sequence writes the request's log line when it ends, with the tokens.
#[derive(Clone, Copy)]
struct LoggedBySequence;

/// The API key (every endpoint but `/health`), the count of answers by status, and the log line of every
/// request that is not a generation's.
async fn guard(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
    let start = Instant::now();
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let key = presented_key(req.headers(), &app.api_keys);
    let response = match key {
        None if !app.api_keys.is_empty() && req.uri().path() != "/health" => {
            let mut r = error(ApiError::bad("a valid API key is needed: `Authorization: Bearer <key>`").with(
                401,
                "invalid_request_error",
                "invalid_api_key",
            ));
            r.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            r
        }
        _ => {
            req.extensions_mut().insert(Owner(key.map(|k| format!("key {k}")).unwrap_or_default()));
            next.run(req).await
        }
    };
    app.metrics.request(response.status().as_u16());
    if response.extensions().get::<LoggedBySequence>().is_none() {
        tracing::info!(
            target: "augur::request",
            method = %method,
            path,
            status = response.status().as_u16(),
            latency_ms = start.elapsed().as_secs_f64() * 1e3,
        );
    }
    response
}

/// 200 once the model is loaded, 503 while it loads (a load balancer's readiness check).
async fn health(State(app): State<Shared>) -> Response {
    match app.ready() {
        Ok(_) => json_reply(json!({"status": "ok"})),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"status": "loading"}).to_string(),
        )
            .into_response(),
    }
}

async fn models(State(app): State<Shared>) -> Response {
    let server = match app.ready() {
        Ok(s) => s,
        Err(e) => return error(e),
    };
    json_reply(json!({"object": "list", "data": [
        {"id": server.model_id, "object": "model", "created": server.started, "owned_by": "augur",
         "max_model_len": server.context}
    ]}))
}

async fn metrics_text(State(app): State<Shared>) -> Response {
    let (active, queued) = app.server.get().map_or((0, 0), |s| s.scheduler.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render(active, queued)).into_response()
}

async fn not_allowed(req: Request) -> Response {
    error(ApiError::bad(format!("{} is not allowed on {}", req.method(), req.uri().path())).with(
        405,
        "invalid_request_error",
        "method_not_allowed",
    ))
}

async fn not_found(req: Request) -> Response {
    error(ApiError::bad(format!("no route {} {}", req.method(), req.uri().path())).with(
        404,
        "invalid_request_error",
        "not_found",
    ))
}

/// The body, or the error its rejection (too large, unreadable) is answered with.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let timed_out = std::iter::successors(std::error::Error::source(&r), |e| e.source())
            .any(|e| e.is::<tower_http::timeout::TimeoutError>());
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::bad(r.body_text()).with(413, "invalid_request_error", "request_too_large")
            }
            _ if timed_out => {
                ApiError::bad("the request body stopped arriving").with(408, "invalid_request_error", "request_timeout")
            }
            status => ApiError::bad(r.body_text()).with(status.as_u16(), "invalid_request_error", "bad_body"),
        }
    })
}

/// Runs `f` (tokenizing: as long as its text) on tokio's blocking threads, so that the two HTTP workers keep
/// answering meanwhile.
async fn off_the_workers(f: impl FnOnce() -> Result<serde_json::Value, ApiError> + Send + 'static) -> Response {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_or_else(error, json_reply),
        Err(_) => error(internal("the tokenizer's thread panicked")),
    }
}

/// `/tokenize`, in vLLM's shape (`prompt` or `messages`, `add_special_tokens`, `add_generation_prompt`) and
/// llama.cpp's (`content`, `add_special`): the ids, their count and the context.
async fn tokenize(State(app): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = move || -> Result<serde_json::Value, ApiError> {
        let server = app.ready()?;
        let b: api::TokenizeBody = api::typed(&body_bytes(body)?)?;
        server.check_model(b.model.as_deref())?;
        let ids = match (b.prompt.or(b.content), b.messages) {
            (Some(text), None) => {
                server.tokenizer.encode(&text, b.add_special_tokens.or(b.add_special).unwrap_or(true))
            }
            (None, Some(messages)) => {
                let messages = api::chat_messages(messages)?;
                server.tokenizer.encode_chat(&messages, b.add_generation_prompt.unwrap_or(true))
            }
            _ => return Err(ApiError::bad("`/tokenize` takes one of `prompt` (or `content`) and `messages`")),
        }
        .map_err(|e| ApiError::bad(e.to_string()))?;
        Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": server.context}))
    };
    off_the_workers(run).await
}

/// `/detokenize`: `{"tokens": [ids]}` → the text, as vLLM's `prompt` and llama.cpp's `content`.
async fn detokenize(State(app): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = move || -> Result<serde_json::Value, ApiError> {
        let server = app.ready()?;
        let b: api::DetokenizeBody = api::typed(&body_bytes(body)?)?;
        server.check_model(b.model.as_deref())?;
        server.check_vocabulary(&b.tokens, |i| format!("tokens[{i}]"))?;
        let text = server.tokenizer.decode(&b.tokens, false).map_err(|e| ApiError::bad(e.to_string()))?;
        Ok(json!({"prompt": text, "content": text}))
    };
    off_the_workers(run).await
}

async fn completions(
    State(app): State<Shared>,
    owner: Option<Extension<Owner>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(app, owner.map(|o| o.0).unwrap_or_default(), body, false).await
}

async fn chat_completions(
    State(app): State<Shared>,
    owner: Option<Extension<Owner>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    complete(app, owner.map(|o| o.0).unwrap_or_default(), body, true).await
}

/// What a sequence's thread tells its handler.
enum Msg {
    /// Admitted and forked: the answer starts.
    Started(Meta),
    /// New text of choice `.0`, with the log-probabilities of the tokens accepted with it when a stream asked.
    Text(usize, String, Option<serde_json::Value>),
    /// Every choice's output, in order.
    Done(Vec<augur::Result<GenerationOutput>>),
    /// Refused before it started (bad options, queue full).
    Refused(ApiError),
}

/// Cancels the generation when the handler or its stream is dropped (the client left).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What an answer still running at the shutdown deadline ends with (its stream's last event, or a 503): the
/// text so far is not passed off as a whole answer.
fn shutdown_error() -> ApiError {
    ApiError::bad("the server shut down before this answer was complete").with(503, "server_error", "server_shutdown")
}

fn internal(message: &str) -> ApiError {
    ApiError::bad(message).with(500, "server_error", "internal_error")
}

/// 400 for what the request asked wrongly, 500 for what failed in the engine.
fn error_status(e: &augur::Error) -> u16 {
    match e {
        augur::Error::InvalidOption(_) | augur::Error::PromptTooLong { .. } | augur::Error::ChatTemplate(_) => 400,
        _ => 500,
    }
}

fn generation_error(e: augur::Error) -> ApiError {
    match error_status(&e) {
        400 => ApiError::bad(e.to_string()),
        _ => ApiError::bad(e.to_string()).with(500, "server_error", "generation_failed"),
    }
}

/// Every choice's output, or the first error.
fn outputs(results: Vec<augur::Result<GenerationOutput>>) -> Result<Vec<GenerationOutput>, ApiError> {
    results.into_iter().map(|r| r.map_err(generation_error)).collect()
}

/// Parses the request here, then runs it on a thread of its own and answers it, whole or as server-sent events.
async fn complete(app: Shared, owner: Owner, body: Result<Bytes, BytesRejection>, chat: bool) -> Response {
    let arrival = Instant::now();
    let server = match app.ready() {
        Ok(s) => Arc::clone(s),
        Err(e) => return error(e),
    };
    let body = match body_bytes(body) {
        Ok(b) => b,
        Err(e) => return error(e),
    };
    let req = match api::parse(&body, chat) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let shape = Shape { chat, stream: req.stream, include_usage: req.include_usage, n: req.n, logprobs: req.logprobs };
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, mut rx) = unbounded_channel();
    let worker = {
        let (app, server, cancel) = (Arc::clone(&app), Arc::clone(&server), Arc::clone(&cancel));
        move || sequence(&app, &server, req, owner, arrival, cancel, tx)
    };
    if let Err(e) = std::thread::Builder::new().name("augur-seq".into()).spawn(worker) {
        return error(internal(&format!("cannot start a sequence thread: {e}")));
    }
    let guard = CancelOnDrop(cancel);
    let meta = match rx.recv().await {
        Some(Msg::Started(meta)) => meta,
        Some(Msg::Refused(e)) => return error(e),
        _ => return error(internal("the sequence ended before it started")),
    };
    let deadline = app.deadline.subscribe();
    let mut response = answer(&server, rx, guard, deadline, meta, shape).await;
    response.extensions_mut().insert(LoggedBySequence);
    response
}

/// What an answer looks like, as its request asked.
#[derive(Clone, Copy)]
struct Shape {
    chat: bool,
    stream: bool,
    include_usage: bool,
    n: usize,
    logprobs: Option<api::LogprobsAsked>,
}

/// The answer of a started request: its events, or its whole body once the sequence is done.
async fn answer(
    server: &Server,
    mut rx: UnboundedReceiver<Msg>,
    guard: CancelOnDrop,
    mut deadline: watch::Receiver<bool>,
    meta: Meta,
    shape: Shape,
) -> Response {
    let Shape { chat, stream, include_usage, n, logprobs } = shape;
    if stream {
        let first = vec![true; n];
        let events = Events { rx, _guard: guard, deadline, meta, chat, include_usage, first, queue: VecDeque::new() };
        return events.into_response();
    }
    loop {
        let msg = tokio::select! {
            msg = rx.recv() => msg,
            _ = deadline.wait_for(|d| *d) => return error(shutdown_error()),
        };
        match msg {
            Some(Msg::Text(..)) => {}
            Some(Msg::Done(results)) => {
                let outs = match outputs(results) {
                    Ok(o) => o,
                    Err(e) => return error(e),
                };
                let choices: Vec<api::Choice<'_>> = outs
                    .iter()
                    .map(|o| api::Choice {
                        text: &o.text,
                        out: o,
                        logprobs: match (&o.logprobs, logprobs) {
                            (Some(l), Some(_)) => api::logprobs(&server.tokenizer, chat, l, &mut 0),
                            _ => serde_json::Value::Null,
                        },
                    })
                    .collect();
                return json_reply(api::response(&meta, chat, &choices, &outs));
            }
            _ => return error(internal("the sequence ended without an answer")),
        }
    }
}

/// A request's sequences: checks, admission, a fork per choice, the generations (on threads of their own when
/// `n` > 1, so that their forwards batch); every step reported through `tx`.
fn sequence(
    app: &App,
    server: &Server,
    req: CompletionRequest,
    owner: Owner,
    arrival: Instant,
    cancel: Arc<AtomicBool>,
    tx: UnboundedSender<Msg>,
) {
    let job = match prepare(server, req, owner, Arc::clone(&cancel)) {
        Ok(j) => j,
        Err(e) => {
            let _ = tx.send(Msg::Refused(e));
            return;
        }
    };
    let n = job.req.n;
    let Some(permit) = server.scheduler.admit(n) else {
        let e = ApiError::bad(format!(
            "the server is busy: {} sequences running and {} waiting; retry later",
            server.scheduler.slots, server.scheduler.queue
        ))
        .with(429, "rate_limit_error", "queue_full");
        let _ = tx.send(Msg::Refused(e));
        return;
    };
    let queue = arrival.elapsed();
    if cancel.load(Ordering::Relaxed) {
        return; // the client left while it waited
    }
    let mut pipes = Vec::with_capacity(n);
    for _ in 0..n {
        let idle = lock(&server.idle).pop();
        match idle.map_or_else(|| lock(&server.template).fork(), Ok) {
            Ok(p) => pipes.push(p),
            Err(e) => {
                lock(&server.idle).extend(pipes);
                let _ = tx.send(Msg::Refused(ApiError::bad(e.to_string()).with(500, "server_error", "fork_failed")));
                return;
            }
        }
    }
    let chat = job.req.chat;
    let meta = Meta {
        id: format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, server.next_id.fetch_add(1, Ordering::Relaxed)),
        created: now(),
        model: server.model_id.clone(),
    };
    let id = meta.id.clone();
    let _ = tx.send(Msg::Started(meta));
    // A streamed request for log-probabilities sends its text block by block, each with its tokens' entries.
    let streamed_logprobs = job.req.stream && job.req.logprobs.is_some();
    // A choice's output, with the time of its first text.
    let run = |index: usize, pipe: &mut Pipeline| {
        let mut first = None;
        let pending = RefCell::new(String::new());
        let send = |text: String, logprobs: Option<serde_json::Value>| {
            if tx.send(Msg::Text(index, text, logprobs)).is_err() {
                cancel.store(true, Ordering::Relaxed);
            }
        };
        let out = {
            let mut text_sink = |text: &str| {
                first.get_or_insert_with(|| arrival.elapsed());
                if streamed_logprobs {
                    pending.borrow_mut().push_str(text);
                } else {
                    send(text.to_string(), None);
                }
            };
            let mut offset = 0;
            let mut block_sink = |_: &[u32], scored: &[TokenLogprob]| {
                let logprobs = api::logprobs(&server.tokenizer, chat, scored, &mut offset);
                send(pending.take(), Some(logprobs));
            };
            let sinks = Sinks {
                text: Some(&mut text_sink),
                tokens: if streamed_logprobs { Some(&mut block_sink) } else { None },
            };
            pipe.call_with(&job.req.prompt, &job.call_for(index), sinks)
        };
        let rest = pending.take();
        if !rest.is_empty() {
            send(rest, None);
        }
        (out, first, arrival.elapsed())
    };
    let ran: Vec<_> = if n == 1 {
        vec![run(0, &mut pipes[0])]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = pipes.iter_mut().enumerate().map(|(i, p)| s.spawn(move || run(i, p))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (Err(augur::Error::Generation("a choice's thread panicked".into())), None, arrival.elapsed())
                    })
                })
                .collect()
        })
    };
    lock(&server.idle).extend(pipes);
    drop(permit);
    for (out, first_token, total) in &ran {
        if let Ok(o) = out {
            let timings = metrics::Timings { queue, first_token: *first_token, total: *total };
            app.metrics.generation(&o.stats, o.finish_reason == FinishReason::Cancelled, &timings);
        }
    }
    let results: Vec<_> = ran.into_iter().map(|(out, ..)| out).collect();
    log_generation(&id, &job, &results, queue, arrival.elapsed());
    let _ = tx.send(Msg::Done(results));
}

/// A generation request's log line: what it asked, what it got, how speculation did, how long it took.
fn log_generation(id: &str, job: &Job, results: &[augur::Result<GenerationOutput>], queue: Duration, total: Duration) {
    let path = if job.req.chat { "/v1/chat/completions" } else { "/v1/completions" };
    let ok: Vec<&GenerationOutput> = results.iter().flatten().collect();
    let (drafted, accepted) = ok.iter().fold((0, 0), |(d, a), o| (d + o.stats.drafted, a + o.stats.accepted));
    let completion: usize = ok.iter().map(|o| o.stats.new_tokens).sum();
    let forwards: usize = ok.iter().map(|o| o.stats.target_forwards).sum();
    let error = results.iter().find_map(|r| r.as_ref().err());
    tracing::info!(
        target: "augur::request",
        id,
        method = "POST",
        path,
        status = error.map_or(200, error_status),
        n = job.req.n,
        stream = job.req.stream,
        user = job.req.user.as_deref(),
        prompt_tokens = ok.first().map_or(0, |o| o.stats.prompt_tokens),
        completion_tokens = completion,
        finish_reason = ok.first().map(|o| o.finish_reason.as_str()),
        speculation = ok.first().map(|o| o.stats.method.as_str()),
        drafted,
        accepted,
        acceptance_rate = if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 },
        tokens_per_forward = if forwards > 0 { completion as f64 / forwards as f64 } else { 0.0 },
        queue_ms = queue.as_secs_f64() * 1e3,
        latency_ms = total.as_secs_f64() * 1e3,
        error = error.map(ToString::to_string),
    );
}

/// A streamed answer: each choice's chunks as its sequence accepts them, then each choice's finish reason, the
/// usage if asked, and `[DONE]`; an error mid-stream is one last event.
struct Events {
    rx: UnboundedReceiver<Msg>,
    _guard: CancelOnDrop,
    deadline: watch::Receiver<bool>,
    meta: Meta,
    chat: bool,
    include_usage: bool,
    /// Per choice: whether its next chunk is its first (chats send the role then).
    first: Vec<bool>,
    /// Payloads ready to send; `None` ends the stream.
    queue: VecDeque<Option<String>>,
}

impl Events {
    fn into_response(mut self) -> Response {
        if self.chat {
            for (i, first) in self.first.iter_mut().enumerate() {
                self.queue.push_back(Some(api::chunk(&self.meta, true, i, Some(""), None, true, None).to_string()));
                *first = false;
            }
        }
        let stream = futures_util::stream::unfold(self, |mut st| async move {
            loop {
                match st.queue.pop_front() {
                    Some(Some(data)) => return Some((Ok::<_, Infallible>(Event::default().data(data)), st)),
                    Some(None) => return None,
                    None => {}
                }
                let msg = tokio::select! {
                    msg = st.rx.recv() => msg,
                    _ = st.deadline.wait_for(|d| *d) => {
                        st.queue.extend([Some(shutdown_error().body()), None]);
                        continue;
                    }
                };
                let (meta, chat) = (&st.meta, st.chat);
                match msg {
                    Some(Msg::Text(i, t, logprobs)) => {
                        let first = std::mem::replace(&mut st.first[i], false);
                        let chunk = api::chunk(meta, chat, i, Some(&t), logprobs, first, None);
                        st.queue.push_back(Some(chunk.to_string()));
                    }
                    Some(Msg::Done(results)) => match outputs(results) {
                        Ok(outs) => {
                            for (i, o) in outs.iter().enumerate() {
                                let reason = api::finish_reason(&o.finish_reason);
                                st.queue.push_back(Some(
                                    api::chunk(meta, chat, i, None, None, false, Some(reason)).to_string(),
                                ));
                            }
                            if st.include_usage {
                                st.queue.push_back(Some(api::usage_chunk(meta, chat, &outs).to_string()));
                            }
                            st.queue.extend([Some("[DONE]".to_string()), None]);
                        }
                        Err(e) => st.queue.extend([Some(e.body()), None]),
                    },
                    _ => return None,
                }
            }
        });
        Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
    }
}

/// A validated request, ready to run.
struct Job {
    req: CompletionRequest,
    call: CallOptions,
}

impl Job {
    /// Choice `index`'s options: with a seed, choice i draws from seed + i, so that choices differ and each
    /// is reproducible.
    fn call_for(&self, index: usize) -> CallOptions {
        let mut call = self.call.clone();
        if let Some(seed) = call.generation.seed.as_mut() {
            *seed = seed.wrapping_add(index as u64);
        }
        call
    }
}

/// vLLM's sampling defaults: a sampling field the request omits takes the model's generation defaults, else
/// OpenAI's (temperature 1, top_p 1, no top-k). Transformers' `do_sample` is not read (vLLM does not read it
/// either): a temperature above 0 samples, so no `top_p`, `top_k` or `min_p` a request sends is ignored.
fn sampling_defaults(generation: &mut GenerationOptions, model: &GenerationOptions) {
    if generation.do_sample.is_none() {
        let t = generation.temperature.or(model.temperature).unwrap_or(1.0);
        generation.do_sample = Some(t > 0.0);
        generation.temperature = Some(t).filter(|&t| t > 0.0);
    }
    generation.top_k = generation.top_k.or(model.top_k).or(Some(0));
    generation.top_p = generation.top_p.or(model.top_p).or(Some(1.0));
}

/// Checks the model, the speculation and the token budget before the request takes a slot.
fn prepare(server: &Server, req: CompletionRequest, owner: Owner, cancel: Arc<AtomicBool>) -> Result<Job, ApiError> {
    server.check_model(req.model.as_deref())?;
    if req.n > server.scheduler.slots {
        return Err(ApiError::param(
            "n",
            format!("`n` is {} but this server runs at most {} sequences at once", req.n, server.scheduler.slots),
        ));
    }
    server.check_vocabulary(&req.stop_token_ids, |i| format!("stop_token_ids[{i}]"))?;
    let biased: Vec<u32> = req.options.sequence_bias.iter().flatten().flat_map(|(ids, _)| ids).copied().collect();
    server.check_vocabulary(&biased, |_| "logit_bias".to_string())?;
    let mut generation = req.options.clone();
    let method = match &req.speculation {
        Speculation::Default => {
            generation.merge(&server.speculation);
            server.default_method
        }
        Speculation::Off => Some(MethodName::Plain),
        Speculation::Method(name, o) => {
            if *name == MethodName::AssistantModel && !server.has_assistant {
                return Err(ApiError::param(
                    "speculation",
                    "speculation method `assistant_model` needs a server started with --assistant-model",
                ));
            }
            generation.merge(o);
            Some(*name)
        }
    };
    sampling_defaults(&mut generation, &server.model_defaults);
    // A seeded text must not depend on the load (which rounds drafted): each position draws on its own.
    if generation.seed.is_some() {
        generation.sample_by_position = Some(true);
    }
    if req.ignore_eos || !req.stop_token_ids.is_empty() {
        let mut eos = if req.ignore_eos { Vec::new() } else { server.eos.clone() };
        eos.extend(req.stop_token_ids.iter().filter(|t| !server.eos.contains(t) || req.ignore_eos));
        generation.eos_token_id = Some(eos);
    }
    let prompt_tokens = match &req.prompt {
        Prompt::Text(t) => server.tokenizer.encode(t, true),
        Prompt::Chat(m) => server.tokenizer.encode_chat(m, true),
    }
    .map_err(|e| ApiError::bad(e.to_string()))?
    .len();
    if prompt_tokens == 0 {
        return Err(ApiError::param("prompt", "the prompt is empty (no tokens)"));
    }
    let asked = generation.max_new_tokens;
    if let (Some(n), Some(limit)) = (asked, server.max_tokens_limit) {
        if n > limit {
            return Err(ApiError::param(
                "max_tokens",
                format!("`max_tokens` is {n} but this server allows at most {limit} new tokens per request"),
            ));
        }
    }
    let budget = server.context.saturating_sub(prompt_tokens);
    // OpenAI's defaults: 16 tokens for completions, the rest of the context for chats; never past the limit.
    let default = if req.chat { budget } else { 16.min(budget) };
    let max_new = asked.unwrap_or_else(|| server.max_tokens_limit.map_or(default, |l| l.min(default)));
    let total = prompt_tokens.checked_add(max_new);
    if total.is_none_or(|t| t > server.context) || budget == 0 {
        let param = match asked {
            Some(n) if budget > 0 && n > budget => "max_tokens",
            _ if req.chat => "messages",
            _ => "prompt",
        };
        let requested = total.map_or_else(|| format!("more than {}", usize::MAX), |t| t.to_string());
        return Err(ApiError::param(
            param,
            format!(
                "This model's maximum context length is {} tokens. However, you requested {requested} tokens \
                 ({prompt_tokens} in the prompt, {max_new} in the completion). Please reduce the prompt or the \
                 completion length.",
                server.context,
            ),
        )
        .with(400, "invalid_request_error", "context_length_exceeded"));
    }
    generation.max_new_tokens = Some(max_new);
    if let Some(min) = generation.min_new_tokens.filter(|&m| m > max_new) {
        return Err(ApiError::param(
            "min_tokens",
            format!("`min_tokens` ({min}) must not be greater than `max_tokens` ({max_new}, its default included)"),
        ));
    }
    api::check_knobs(&generation)?;
    let backoff =
        BackoffPolicy { running: Arc::clone(&server.scheduler.running), max_load: server.speculation_max_load };
    let call = CallOptions {
        generation,
        return_full_text: Some(req.echo),
        add_special_tokens: Some(true),
        cancel: Some(cancel),
        backoff: Some(backoff),
        method,
        logprobs: req.logprobs.map(|l| l.top),
        include_stop_str_in_output: Some(req.include_stop),
        stop_strings_match_prompt: Some(false),
        suffix_cache: Some(SuffixCacheRef { cache: Arc::clone(&server.suffix_cache), owner: owner.0 }),
    };
    Ok(Job { req, call })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    fn fixture(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
    }

    fn load(dir: &std::path::Path) -> Pipeline {
        let target = augur::pipeline::LoadedLm::load(dir, &augur::Device::Cpu).unwrap();
        Pipeline { target, assistant: None, defaults: GenerationOptions::default() }
    }

    fn tiny() -> Pipeline {
        load(&fixture("tiny-llama"))
    }

    /// A server over `pipe`, loaded, as a router to call in-process.
    fn serving(pipe: Pipeline, config: &ServeConfig) -> Router {
        let app = Arc::new(App {
            server: OnceLock::new(),
            metrics: Metrics::default(),
            api_keys: api_keys(config),
            deadline: watch::channel(false).0,
        });
        let router = router(Arc::clone(&app), config).unwrap();
        let _ = app.server.set(Arc::new(load_server(pipe, config).unwrap()));
        router
    }

    /// A copy of tiny-llama under the target directory, with `file`'s JSON changed by `edit`.
    fn tiny_edited(name: &str, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
        edited("tiny-llama", name, file, edit)
    }

    /// A copy of fixture `from` under the target directory, with `file`'s JSON changed by `edit`.
    fn edited(from: &str, name: &str, file: &str, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/test-fixtures")
            .join(format!("{from}-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for entry in std::fs::read_dir(fixture(from)).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
        let path = dir.join(file);
        let mut json: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        edit(&mut json);
        std::fs::write(&path, json.to_string()).unwrap();
        dir
    }

    /// tiny-llama with `clean_up_tokenization_spaces` on (" ." → ".").
    fn tiny_cleaning_up() -> std::path::PathBuf {
        tiny_edited("clean-up", "tokenizer_config.json", |c| c["clean_up_tokenization_spaces"] = json!(true))
    }

    async fn call(app: &Router, method: &str, path: &str, body: &str) -> (StatusCode, serde_json::Value) {
        call_as(app, None, method, path, body).await
    }

    /// [`call`] presenting `key`.
    async fn call_as(
        app: &Router,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(key) = key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        let r = app.clone().oneshot(req.body(Body::from(body.to_string())).unwrap()).await.unwrap();
        let status = r.status();
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    /// Before the model is loaded the server already answers: `/health` 503 (a load balancer keeps traffic
    /// away), the model's endpoints 503 `model_loading`, `/metrics` 200; once loaded, all of them serve.
    #[tokio::test]
    async fn health_is_503_until_the_model_is_loaded() {
        let config = ServeConfig::default();
        let app = Arc::new(App {
            server: OnceLock::new(),
            metrics: Metrics::default(),
            api_keys: api_keys(&config),
            deadline: watch::channel(false).0,
        });
        let router = router(Arc::clone(&app), &config).unwrap();
        assert_eq!(
            call(&router, "GET", "/health", "").await,
            (StatusCode::SERVICE_UNAVAILABLE, json!({"status": "loading"}))
        );
        for (method, path, body) in [
            ("GET", "/v1/models", ""),
            ("POST", "/v1/completions", r#"{"prompt": "a", "max_tokens": 2}"#),
            ("POST", "/tokenize", r#"{"prompt": "a"}"#),
        ] {
            let (status, body) = call(&router, method, path, body).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}");
            assert_eq!(body["error"]["code"], "model_loading", "{path}");
        }
        assert_eq!(call(&router, "GET", "/metrics", "").await.0, StatusCode::OK);

        let _ = app.server.set(Arc::new(load_server(tiny(), &config).unwrap()));
        assert_eq!(call(&router, "GET", "/health", "").await, (StatusCode::OK, json!({"status": "ok"})));
        assert_eq!(call(&router, "GET", "/v1/models", "").await.1["data"][0]["id"], "tiny-llama");
        let (status, body) = call(&router, "POST", "/v1/completions", r#"{"prompt": "a", "max_tokens": 2}"#).await;
        assert_eq!((status, body["usage"]["completion_tokens"].clone()), (StatusCode::OK, json!(2)));
    }

    /// llama.cpp's server test: a stop string whose start lies in the prompt does not stop the answer (OpenAI,
    /// vLLM and llama-server match the generated text only).
    #[tokio::test]
    async fn a_stop_string_whose_start_lies_in_the_prompt() {
        let router = serving(tiny(), &ServeConfig::default());
        let prompt = "Name: Bob\n";
        let body = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0});
        let (status, plain) = call(&router, "POST", "/v1/completions", &body.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
        let first = text.chars().next().expect("some text");
        // The prompt's last character and the answer's first: a stop string that spans the two.
        let stop = format!("\n{first}");
        let mut stopped = body.clone();
        stopped["stop"] = json!([stop]);
        let (status, reply) = call(&router, "POST", "/v1/completions", &stopped.to_string()).await;
        assert_eq!(status, StatusCode::OK);
        let want = text.find(&stop).map_or(text.as_str(), |i| &text[..i]);
        assert!(!want.is_empty());
        assert_eq!(reply["choices"][0]["text"], want, "stop {stop:?} in {text:?}");
    }

    /// With the tokenizer's space clean-up on, a stop string fires at the token that completes it (not when the
    /// clean-up releases its text), and one completed by the budget's last token ends the answer with `stop`
    /// instead of leaking into it with `length`.
    #[tokio::test]
    async fn stop_strings_match_before_the_space_clean_up() {
        let dir = tiny_cleaning_up();
        let pipe = load(&dir);
        assert!(pipe.target.tokenizer.clean_up_tokenization_spaces());
        let tokenizer = Arc::clone(&pipe.target.tokenizer);
        let router = serving(pipe, &ServeConfig::default());
        let mut found = None;
        let mut pipe = load(&dir);
        for prompt in ["The quick brown fox", "Once upon a time", "Hello, my name is", "a b c d e f g", "1 2 3 4"] {
            // The raw (not cleaned-up) text after each token, from the stream without the clean-up.
            let tokens = tokenizer.encode(prompt, true).unwrap();
            let greedy = GenerationOptions { max_new_tokens: Some(32), do_sample: Some(false), ..Default::default() };
            let out = pipe.generate_ids(&tokens, &greedy, None).unwrap();
            let mut stream = tokenizer.stream(true).without_clean_up();
            let mut raw = String::new();
            for (k, &t) in out.tokens.iter().enumerate() {
                let piece = stream.push(t).unwrap();
                raw.push_str(&piece);
                let chars: Vec<char> = raw.chars().collect();
                if piece.is_empty() || chars.len() < 3 {
                    continue;
                }
                let stop: String = chars[chars.len() - 2..].iter().collect();
                let before: String = chars[chars.len().saturating_sub(4)..chars.len() - 2].iter().collect();
                // The clean-up holds text back after a space: one just before the stop string.
                let first_at_end = raw.find(&stop) == Some(raw.len() - stop.len());
                if before.contains(' ') && !stop.contains(' ') && !stop.contains('\u{FFFD}') && first_at_end {
                    found = Some((prompt, k + 1, stop));
                    break;
                }
            }
            if found.is_some() {
                break;
            }
        }
        let (prompt, k, stop) = found.expect("a stop string right after a space in some greedy answer");
        for max_tokens in [k, 32] {
            let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stop": [stop]});
            let (status, reply) = call(&router, "POST", "/v1/completions", &body.to_string()).await;
            assert_eq!(status, StatusCode::OK);
            let text = reply["choices"][0]["text"].as_str().unwrap();
            assert!(!text.contains(&stop), "{stop:?} leaked into {text:?} (max_tokens {max_tokens})");
            assert_eq!(reply["choices"][0]["finish_reason"], "stop", "max_tokens {max_tokens}");
            assert_eq!(reply["usage"]["completion_tokens"], k, "the stop string's token ends it");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    async fn text(router: &Router, body: serde_json::Value) -> String {
        let (status, reply) = call(router, "POST", "/v1/completions", &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        reply["choices"][0]["text"].as_str().unwrap().to_string()
    }

    /// vLLM's defaults: a request with no `temperature` samples at OpenAI's temperature 1 (the tiny model's
    /// generation config sets none), honouring the `top_p` it sends; a model's generation defaults fill what a
    /// request omits.
    #[tokio::test]
    async fn omitted_sampling_fields_take_the_model_defaults_else_openais() {
        let router = serving(tiny(), &ServeConfig::default());
        let body = |extra: serde_json::Value| {
            let mut b = json!({"prompt": "Once upon a time", "max_tokens": 12});
            b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            b
        };
        let mut omitted = Vec::new();
        for seed in 0..4 {
            let implicit = text(&router, body(json!({"top_p": 0.95, "seed": seed}))).await;
            let explicit = text(&router, body(json!({"top_p": 0.95, "seed": seed, "temperature": 1.0}))).await;
            assert_eq!(implicit, explicit, "seed {seed}: no temperature is temperature 1");
            let nucleus = text(&router, body(json!({"top_p": 0.95, "seed": seed, "temperature": 1.0, "top_k": -1})));
            assert_eq!(implicit, nucleus.await, "seed {seed}: OpenAI has no top-k");
            omitted.push(implicit);
        }
        let greedy = text(&router, body(json!({"temperature": 0}))).await;
        omitted.dedup();
        assert!(omitted.len() > 1 && omitted.iter().any(|t| *t != greedy), "sampled, not greedy: {omitted:?}");

        // A model whose generation config says temperature 0.5 and top-k 5: what the request omits comes from it.
        let mut pipe = tiny();
        pipe.target.defaults.temperature = Some(0.5);
        pipe.target.defaults.top_k = Some(5);
        pipe.target.defaults.do_sample = Some(false);
        let router = serving(pipe, &ServeConfig::default());
        let tiny_router = serving(tiny(), &ServeConfig::default());
        for seed in 0..4 {
            let implicit = text(&router, body(json!({"seed": seed}))).await;
            let explicit = text(&tiny_router, body(json!({"seed": seed, "temperature": 0.5, "top_k": 5}))).await;
            assert_eq!(implicit, explicit, "seed {seed}: the model's temperature and top-k");
        }
    }

    /// An id below the embedding's rows but past the tokenizer's vocabulary is padding, no token: refused in
    /// `logit_bias`, `stop_token_ids` and `/detokenize`, naming the field.
    #[tokio::test]
    async fn ids_that_no_token_has_are_refused() {
        // tiny-llama whose tokenizer lacks its last token (and the merge that makes it): row 447 is padding.
        let dir = tiny_edited("padded", "tokenizer.json", |t| {
            let vocab = t["model"]["vocab"].as_object_mut().unwrap();
            let last = vocab.iter().max_by_key(|(_, id)| id.as_u64()).map(|(k, _)| k.clone()).unwrap();
            vocab.remove(&last);
            let merges = t["model"]["merges"].as_array_mut().unwrap();
            merges.retain(|m| {
                let parts: Vec<String> = match m {
                    serde_json::Value::String(s) => s.split(' ').map(str::to_string).collect(),
                    other => other.as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect(),
                };
                parts.concat() != last && !parts.contains(&last)
            });
        });
        let pipe = load(&dir);
        assert_eq!((pipe.target.tokenizer.vocab_size(), pipe.target.config().vocab_size), (447, 448));
        let router = serving(pipe, &ServeConfig::default());
        for (path, body, param) in [
            ("/v1/completions", json!({"prompt": "a", "logit_bias": {"447": 5}}), "logit_bias"),
            ("/v1/completions", json!({"prompt": "a", "stop_token_ids": [5, 447]}), "stop_token_ids[1]"),
            ("/detokenize", json!({"tokens": [447]}), "tokens[0]"),
        ] {
            let (status, reply) = call(&router, "POST", path, &body.to_string()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {reply}");
            assert_eq!(reply["error"]["param"], param, "{body}");
        }
        let ok = json!({"prompt": "a", "logit_bias": {"446": 5}, "stop_token_ids": [446], "max_tokens": 2});
        assert_eq!(call(&router, "POST", "/v1/completions", &ok.to_string()).await.0, StatusCode::OK);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// llama.cpp's server test of a large `logit_bias`: OpenAI's 300 entries all apply (299 tokens banned, one
    /// pushed up: every token generated is that one); a 301st is refused.
    #[tokio::test]
    async fn a_large_logit_bias() {
        let router = serving(tiny(), &ServeConfig::default());
        let favourite = 300;
        let mut bias: serde_json::Map<String, serde_json::Value> =
            (1..300).map(|i| (i.to_string(), json!(-100))).collect();
        bias.insert(favourite.to_string(), json!(100));
        let body = json!({"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 0, "logit_bias": bias,
                          "ignore_eos": true, "seed": 3});
        let (status, reply) = call(&router, "POST", "/v1/completions", &body.to_string()).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let tokenizer = augur::pipeline::load_tokenizer(&fixture("tiny-llama")).unwrap();
        let want = tokenizer.decode(&[favourite], false).unwrap();
        let tokens = reply["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
        assert_eq!(tokens.len(), 8);
        assert!(tokens.iter().all(|t| *t == json!(want)), "{tokens:?}");
        bias.insert("301".into(), json!(1));
        let (status, reply) =
            call(&router, "POST", "/v1/completions", &json!({"prompt": "a", "logit_bias": bias}).to_string()).await;
        assert_eq!((status, &reply["error"]["param"]), (StatusCode::BAD_REQUEST, &json!("logit_bias")));
    }

    /// llama.cpp's "seeded sampling across parallel slots" and vLLM's "seeded row inside a mixed batch": a seeded
    /// request's text is the same alone, with speculation off, with every round backed off, without the cost
    /// model, and among 8 concurrent clients (the others unseeded or seeded otherwise), since each position draws
    /// from its own stream whichever rounds drafted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn seeded_text_does_not_depend_on_which_rounds_drafted() {
        let prompt = "one two three one two three one two three one two three one two";
        let seeded = |speculation: serde_json::Value| {
            json!({"prompt": prompt, "max_tokens": 32, "temperature": 1.0, "seed": 5, "ignore_eos": true,
                   "speculation": speculation})
        };
        let lookup = json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 1});
        let config = ServeConfig { parallel: 8, speculation_max_load: 64, ..ServeConfig::default() };
        let router = serving(tiny(), &config);
        let (status, alone) = call(&router, "POST", "/v1/completions", &seeded(lookup.clone()).to_string()).await;
        assert_eq!(status, StatusCode::OK);
        assert!(alone["usage"]["speculation"]["drafted_tokens"].as_u64() > Some(0), "drafts were proposed");
        let want = alone["choices"][0]["text"].as_str().unwrap().to_string();

        assert_eq!(text(&router, seeded(json!("off"))).await, want, "speculation off");
        let mut uncapped = lookup.clone();
        uncapped["cost_aware_drafting"] = json!(false);
        assert_eq!(text(&router, seeded(uncapped)).await, want, "without the cost model");
        // A server whose every sequence backs off (more than 0 running): no round drafts.
        let backing_off = serving(tiny(), &ServeConfig { speculation_max_load: 0, ..config.clone() });
        let (_, off) = call(&backing_off, "POST", "/v1/completions", &seeded(lookup.clone()).to_string()).await;
        assert_eq!(off["usage"]["speculation"]["drafted_tokens"], 0, "every round backed off");
        assert_eq!(off["choices"][0]["text"], want.as_str(), "backed off");

        let clients: Vec<_> = (0..8)
            .map(|i| {
                let router = router.clone();
                let mut body = seeded(lookup.clone());
                match i % 4 {
                    0 | 1 => {}
                    2 => body["seed"] = json!(100 + i),
                    _ => drop(body.as_object_mut().unwrap().remove("seed")),
                }
                tokio::spawn(async move { (i, call(&router, "POST", "/v1/completions", &body.to_string()).await) })
            })
            .collect();
        for client in clients {
            let (i, (status, reply)) = client.await.unwrap();
            assert_eq!(status, StatusCode::OK);
            if i % 4 < 2 {
                assert_eq!(reply["choices"][0]["text"], want.as_str(), "client {i} under load");
            }
        }
    }

    /// A text prompt of at least `tokens` tokens (a repeated phrase, which prompt lookup finds matches in).
    fn long_prompt(tokenizer: &Tokenizer, tokens: usize) -> (String, usize) {
        let mut prompt = String::new();
        loop {
            let n = tokenizer.encode(&prompt, true).unwrap().len();
            if n >= tokens {
                return (prompt, n);
            }
            prompt.push_str("one two three four ");
        }
    }

    /// llama.cpp's "the context is never exceeded with speculation on": a request that fills the context to its
    /// last token, with chains and with trees (whose nodes each take a place in the cache), completes.
    #[tokio::test]
    async fn the_context_is_never_exceeded_with_speculation_on() {
        let mut pipe = tiny();
        let assistant = fixture("tiny-llama-assistant");
        pipe.assistant =
            Some(augur::pipeline::Assistant::load(&assistant, &augur::Device::Cpu, &pipe.target.tokenizer).unwrap());
        let context = pipe.target.config().max_position_embeddings;
        let (prompt, n) = long_prompt(&pipe.target.tokenizer, context - 40);
        let router = serving(pipe, &ServeConfig::default());
        for speculation in [
            json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 1}),
            json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 8, "max_matching_ngram_size": 1,
                   "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 32, "cost_aware_drafting": false}),
            json!({"method": "assistant_model", "num_assistant_tokens": 6, "cost_aware_drafting": false}),
            json!({"method": "assistant_model", "num_assistant_tokens": 6, "speculative_eagle_topk": 3,
                   "speculative_num_draft_tokens": 24, "assistant_confidence_threshold": 0.9,
                   "cost_aware_drafting": false}),
        ] {
            let body = json!({"prompt": prompt, "max_tokens": context - n, "temperature": 0, "ignore_eos": true,
                              "speculation": speculation});
            let (status, reply) = call(&router, "POST", "/v1/completions", &body.to_string()).await;
            assert_eq!(status, StatusCode::OK, "{speculation}: {reply}");
            assert_eq!(reply["usage"]["completion_tokens"], context - n, "{speculation}");
            assert!(reply["usage"]["speculation"]["drafted_tokens"].as_u64() > Some(0), "{speculation}: drafted");
        }
    }

    /// An assistant whose context is shorter than the target's drafts while it has room, is cut to that room,
    /// then the request decodes plainly to its end, which the usage reports; the text is plain greedy's.
    #[tokio::test]
    async fn an_assistant_with_a_shorter_context_falls_back_to_plain() {
        let short =
            edited("tiny-llama-assistant", "short", "config.json", |c| c["max_position_embeddings"] = json!(300));
        let mut pipe = tiny();
        let assistant = augur::pipeline::Assistant::load(&short, &augur::Device::Cpu, &pipe.target.tokenizer).unwrap();
        assert_eq!(assistant.config().max_position_embeddings, 300);
        pipe.assistant = Some(assistant);
        let (prompt, n) = long_prompt(&pipe.target.tokenizer, 280);
        assert!(n < 300);
        let router = serving(pipe, &ServeConfig::default());
        let body = |speculation: serde_json::Value| {
            json!({"prompt": prompt, "max_tokens": 60, "temperature": 0, "ignore_eos": true,
                   "speculation": speculation})
        };
        for tree in [1, 3] {
            let speculation = json!({"method": "assistant_model", "num_assistant_tokens": 8,
                                     "speculative_eagle_topk": tree, "cost_aware_drafting": false});
            let (status, reply) = call(&router, "POST", "/v1/completions", &body(speculation).to_string()).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            let usage = &reply["usage"];
            assert!(usage["speculation"]["drafted_tokens"].as_u64() > Some(0), "drafted while it had room");
            assert_eq!(usage["speculation"]["context_fallbacks"], 1, "{usage}");
            assert_eq!(usage["completion_tokens"], 60);
            assert_eq!(reply["choices"][0]["text"], text(&router, body(json!("off"))).await.as_str());
        }
        let _ = std::fs::remove_dir_all(&short);
    }

    /// Waits (only to catch a hang) until the scheduler's gauges satisfy `done`, and returns them.
    fn gauges_when(scheduler: &Scheduler, done: impl Fn((usize, usize)) -> bool) -> (usize, usize) {
        let t0 = Instant::now();
        loop {
            let g = scheduler.gauges();
            if done(g) {
                return g;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "stuck at {g:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Admission is first come first served: a request for 2 slots waiting for them is not passed by a later
    /// request for 1 that would fit (before, a steady stream of single requests could hold `n > 1` off forever).
    #[test]
    fn admission_is_first_come_first_served() {
        let scheduler = Scheduler::new(2, 8);
        let first = scheduler.admit(1).unwrap();
        std::thread::scope(|s| {
            let pair = s.spawn(|| {
                let p = scheduler.admit(2).unwrap();
                let running = scheduler.gauges().0;
                drop(p);
                running
            });
            gauges_when(&scheduler, |(_, waiting)| waiting == 1);
            let (release, released) = std::sync::mpsc::channel::<()>();
            let scheduler = &scheduler;
            let single = s.spawn(move || {
                let p = scheduler.admit(1).unwrap();
                let _ = released.recv();
                drop(p);
            });
            // The single request fits beside `first`, but it came after the pair: it waits.
            let g = gauges_when(scheduler, |(running, waiting)| running == 2 || waiting == 2);
            assert_eq!(g, (1, 2), "the later single request must queue behind the pair");
            drop(first);
            assert_eq!(pair.join().unwrap(), 2, "the pair ran with both slots");
            release.send(()).unwrap();
            single.join().unwrap();
        });
        assert_eq!(scheduler.gauges(), (0, 0));
    }

    /// Suffix decoding's cache of earlier answers is per API key: a key's repeated request drafts from its own
    /// earlier answer (the usage says where each round's drafts came from), another key's never does; the text
    /// is the same for all.
    #[tokio::test]
    async fn api_keys_never_share_the_suffix_cache() {
        let config = ServeConfig { api_key: Some("alpha, beta".into()), ..ServeConfig::default() };
        let router = serving(tiny(), &config);
        let body = json!({"prompt": "a b c", "max_tokens": 24, "temperature": 0, "speculation": {"method": "suffix"}})
            .to_string();
        let ask = |key| {
            let (router, body) = (router.clone(), body.clone());
            async move {
                let (status, reply) = call_as(&router, Some(key), "POST", "/v1/completions", &body).await;
                assert_eq!(status, StatusCode::OK, "{reply}");
                let cached = reply["usage"]["speculation"]["draft_sources"]["cache"].as_u64().unwrap_or(0);
                (reply["choices"][0]["text"].clone(), cached)
            }
        };
        let (text, first) = ask("alpha").await;
        let (other_text, other) = ask("beta").await;
        let (again_text, again) = ask("alpha").await;
        assert_eq!((first, other), (0, 0), "no earlier answer of these keys");
        assert!(again > 0, "alpha's second request did not draft from alpha's first answer");
        assert_eq!((&other_text, &again_text), (&text, &text));
        assert_eq!(call(&router, "POST", "/v1/completions", &body).await.0, StatusCode::UNAUTHORIZED);
    }

    /// `/tokenize` runs off the HTTP workers: on a runtime with one worker, `/health` is answered while a long
    /// text is being tokenized (before, the tokenizer held the worker until it was done).
    #[tokio::test(flavor = "current_thread")]
    async fn tokenize_runs_off_the_http_workers() {
        let router = serving(tiny(), &ServeConfig::default());
        let text = "the quick brown fox jumps over the lazy dog ".repeat(10_000);
        let done = Arc::new(AtomicBool::new(false));
        let tokenizing = {
            let (router, done) = (router.clone(), Arc::clone(&done));
            let body = json!({"prompt": text}).to_string();
            tokio::spawn(async move {
                let (status, reply) = call(&router, "POST", "/tokenize", &body).await;
                done.store(true, Ordering::SeqCst);
                (status, reply["count"].as_u64())
            })
        };
        tokio::task::yield_now().await;
        assert_eq!(call(&router, "GET", "/health", "").await.0, StatusCode::OK);
        assert!(!done.load(Ordering::SeqCst), "/health waited for the tokenizer");
        let (status, count) = tokenizing.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert!(count > Some(50_000));
    }
}
