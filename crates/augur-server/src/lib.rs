//! An OpenAI-compatible HTTP server over augur's pipeline (`augur serve` runs it).
//!
//! Every admitted request runs as its own sequence (a fork of the loaded pipeline: shared weights, its own KV
//! cache and drafter state) on its connection's thread; up to `parallel` sequences run at once, and the
//! forwards they call at the same time run as one batched forward (linear layers over the rows of all of them,
//! attention per sequence; see `augur::batching::Batched`). Up to `queue` more wait for a slot; beyond
//! that the server answers 429. Each sequence's speculation pauses under load or when its drafts stop being
//! accepted, without changing its output.

mod api;
mod http;
mod metrics;

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use augur::generation::config::GenerationOptions;
use augur::generation::drafters::BackoffPolicy;
use augur::generation::method::MethodName;
use augur::generation::output::GenerationOutput;
use augur::generation::stopping::FinishReason;
use augur::pipeline::{CallOptions, Pipeline, Prompt};
use augur::tokenizer::Tokenizer;
use serde_json::json;

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
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// A sequence stops drafting while more than this many sequences run (their forwards are batched then,
    /// which already shares the cost of reading the weights).
    pub speculation_max_load: usize,
    /// Each request's default speculation options; a request overrides them with its `speculation` field.
    pub speculation: GenerationOptions,
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
            speculation_max_load: 2,
            speculation: GenerationOptions::default(),
        }
    }
}

/// Admission: at most `slots` sequences run, at most `queue` wait.
struct Scheduler {
    slots: usize,
    queue: usize,
    /// (running, waiting)
    state: Mutex<(usize, usize)>,
    freed: Condvar,
    /// Running sequences, read by every sequence's back-off policy.
    running: Arc<AtomicUsize>,
}

struct Permit<'a>(&'a Scheduler);

impl Scheduler {
    fn state(&self) -> MutexGuard<'_, (usize, usize)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot, or returns `None` at once when the queue is full.
    fn admit(&self) -> Option<Permit<'_>> {
        let mut s = self.state();
        if s.0 >= self.slots && s.1 >= self.queue {
            return None;
        }
        s.1 += 1;
        while s.0 >= self.slots {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.1 -= 1;
        s.0 += 1;
        self.running.store(s.0, Ordering::Relaxed);
        Some(Permit(self))
    }

    fn gauges(&self) -> (usize, usize) {
        *self.state()
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state();
        s.0 -= 1;
        self.0.running.store(s.0, Ordering::Relaxed);
        self.0.freed.notify_one();
    }
}

struct Server {
    model_id: String,
    /// Other names a request may use for the model (its path, the name it was loaded by).
    aliases: Vec<String>,
    template: Mutex<Pipeline>,
    /// Idle sequences (forks of `template`) kept with their cache buffers.
    idle: Mutex<Vec<Pipeline>>,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    has_assistant: bool,
    /// The default speculation options.
    speculation: GenerationOptions,
    speculation_max_load: usize,
    scheduler: Scheduler,
    metrics: Metrics,
    max_body: usize,
    next_id: AtomicU64,
    started: u64,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves `pipe` until the process ends. Each request runs on a fork of it.
pub fn serve(pipe: Pipeline, config: ServeConfig) -> Result<()> {
    if config.parallel == 0 {
        anyhow::bail!("the server needs at least one parallel sequence");
    }
    // The first sequence, forked now so that a model that cannot be forked fails at start, not per request.
    let first = pipe.fork()?;
    let path = pipe.target.path.clone();
    let model_id = config.served_model_name.clone().unwrap_or_else(|| {
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string())
    });
    let server = Arc::new(Server {
        aliases: config.aliases.iter().cloned().chain([path.display().to_string()]).collect(),
        model_id,
        tokenizer: Arc::clone(&pipe.target.tokenizer),
        context: pipe.target.config().max_position_embeddings,
        has_assistant: pipe.assistant.is_some(),
        idle: Mutex::new(vec![first]),
        template: Mutex::new(pipe),
        speculation: config.speculation,
        speculation_max_load: config.speculation_max_load,
        scheduler: Scheduler {
            slots: config.parallel,
            queue: config.queue,
            state: Mutex::new((0, 0)),
            freed: Condvar::new(),
            running: Arc::new(AtomicUsize::new(0)),
        },
        metrics: Metrics::default(),
        max_body: config.max_body_bytes,
        next_id: AtomicU64::new(1),
        started: now(),
    });
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .with_context(|| format!("cannot listen on {}:{}", config.host, config.port))?;
    let addr = listener.local_addr()?;
    println!("augur serve: listening on http://{addr} (model `{}`)", server.model_id);
    use std::io::Write;
    std::io::stdout().flush()?;
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let server = Arc::clone(&server);
        let spawned = std::thread::Builder::new().name("augur-conn".into()).spawn(move || connection(&server, stream));
        if let Err(e) = spawned {
            eprintln!("augur serve: cannot start a connection thread: {e}");
        }
    }
    Ok(())
}

/// Serves the requests of one connection until it closes.
fn connection(server: &Server, stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(http::IDLE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let Ok(write) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    let mut write = write;
    loop {
        let req = match http::read_request(&mut reader, server.max_body) {
            Ok(r) => r,
            Err(http::ReadError::Closed) => return,
            Err(http::ReadError::Bad(m)) => {
                let e = ApiError::bad(m);
                server.metrics.request(e.status);
                let _ = http::respond(&mut write, e.status, "application/json", e.body().as_bytes(), false);
                http::drain(reader.get_mut(), server.max_body.saturating_mul(8));
                return;
            }
        };
        let keep = req.keep_alive();
        // A panic anywhere in a request must not take the connection thread's server down with it.
        let handled = catch_unwind(AssertUnwindSafe(|| route(server, &req, &mut write, keep)));
        let keep_going = match handled {
            Ok(Ok(kept)) => kept,
            Ok(Err(_)) => false,
            Err(_) => {
                let e = ApiError::bad("internal error").with(500, "server_error", "internal_error");
                server.metrics.request(500);
                let _ = http::respond(&mut write, 500, "application/json", e.body().as_bytes(), false);
                false
            }
        };
        if !keep_going {
            return;
        }
    }
}

/// Answers one request; returns whether the connection stays open.
fn route(server: &Server, req: &http::Request, out: &mut TcpStream, keep: bool) -> std::io::Result<bool> {
    let json_reply = |out: &mut TcpStream, status: u16, body: String| -> std::io::Result<bool> {
        server.metrics.request(status);
        http::respond(out, status, "application/json", body.as_bytes(), keep)?;
        Ok(keep)
    };
    let error = |out: &mut TcpStream, e: ApiError| json_reply(out, e.status, e.body());
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/health") => json_reply(out, 200, json!({"status": "ok"}).to_string()),
        ("GET", "/v1/models") => json_reply(
            out,
            200,
            json!({"object": "list", "data": [
                {"id": server.model_id, "object": "model", "created": server.started, "owned_by": "augur"}
            ]})
            .to_string(),
        ),
        ("GET", "/metrics") => {
            let (active, queued) = server.scheduler.gauges();
            let body = server.metrics.render(active, queued);
            server.metrics.request(200);
            http::respond(out, 200, "text/plain; version=0.0.4", body.as_bytes(), keep)?;
            Ok(keep)
        }
        ("POST", "/v1/completions") | ("POST", "/v1/chat/completions") => {
            let chat = req.path == "/v1/chat/completions";
            match api::parse(&req.body, chat).and_then(|r| prepare(server, r)) {
                Err(e) => error(out, e),
                Ok(job) => complete(server, job, out, keep),
            }
        }
        (_, "/health" | "/v1/models" | "/metrics" | "/v1/completions" | "/v1/chat/completions") => error(
            out,
            ApiError::bad(format!("{} is not allowed on {}", req.method, req.path)).with(
                405,
                "invalid_request_error",
                "method_not_allowed",
            ),
        ),
        _ => error(
            out,
            ApiError::bad(format!("no route {} {}", req.method, req.path)).with(
                404,
                "invalid_request_error",
                "not_found",
            ),
        ),
    }
}

/// A validated request, ready to run.
struct Job {
    req: CompletionRequest,
    call: CallOptions,
}

/// Checks the model, the speculation and the token budget before the request takes a slot.
fn prepare(server: &Server, req: CompletionRequest) -> Result<Job, ApiError> {
    if let Some(m) = &req.model {
        if *m != server.model_id && !server.aliases.contains(m) {
            return Err(ApiError::param(
                "model",
                format!("The model `{m}` does not exist (this server has `{}`)", server.model_id),
            )
            .with(404, "invalid_request_error", "model_not_found"));
        }
    }
    let mut generation = req.options.clone();
    let mut method = None;
    match &req.speculation {
        Speculation::Default => generation.merge(&server.speculation),
        Speculation::Off => method = Some(MethodName::Plain),
        Speculation::Method(name, o) => {
            if *name == MethodName::AssistantModel && !server.has_assistant {
                return Err(ApiError::param(
                    "speculation",
                    "speculation method `assistant_model` needs a server started with --assistant-model",
                ));
            }
            generation.merge(o);
            method = Some(*name);
        }
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
    let budget = server.context.saturating_sub(prompt_tokens);
    // OpenAI's defaults: 16 tokens for completions, the rest of the context for chats.
    let max_new = generation.max_new_tokens.unwrap_or(if req.chat { budget } else { 16.min(budget) });
    if prompt_tokens + max_new > server.context || budget == 0 {
        return Err(ApiError::param(
            if req.chat { "messages" } else { "prompt" },
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} tokens \
                 ({prompt_tokens} in the prompt, {max_new} in the completion). Please reduce the prompt or the \
                 completion length.",
                server.context,
                prompt_tokens + max_new
            ),
        )
        .with(400, "invalid_request_error", "context_length_exceeded"));
    }
    generation.max_new_tokens = Some(max_new);
    let backoff =
        BackoffPolicy { running: Arc::clone(&server.scheduler.running), max_load: server.speculation_max_load };
    let call = CallOptions {
        generation,
        return_full_text: Some(req.echo),
        add_special_tokens: Some(true),
        cancel: Some(Arc::new(AtomicBool::new(false))),
        backoff: Some(backoff),
        method,
    };
    Ok(Job { req, call })
}

/// Runs an admitted job on a sequence of its own and answers it, whole or as server-sent events.
fn complete(server: &Server, job: Job, out: &mut TcpStream, keep: bool) -> std::io::Result<bool> {
    let Some(_permit) = server.scheduler.admit() else {
        let e = ApiError::bad(format!(
            "the server is busy: {} sequences running and {} waiting; retry later",
            server.scheduler.slots, server.scheduler.queue
        ))
        .with(429, "rate_limit_error", "queue_full");
        server.metrics.request(429);
        http::respond(out, 429, "application/json", e.body().as_bytes(), keep)?;
        return Ok(keep);
    };
    if !http::peer_alive(out) {
        return Ok(false);
    }
    let idle = lock(&server.idle).pop();
    let mut pipe = match idle.map_or_else(|| lock(&server.template).fork(), Ok) {
        Ok(p) => p,
        Err(e) => {
            let err = ApiError::bad(e.to_string()).with(500, "server_error", "fork_failed");
            server.metrics.request(500);
            http::respond(out, 500, "application/json", err.body().as_bytes(), keep)?;
            return Ok(keep);
        }
    };
    let chat = job.req.chat;
    let meta = Meta {
        id: format!("{}-{}", if chat { "chatcmpl" } else { "cmpl" }, server.next_id.fetch_add(1, Ordering::Relaxed)),
        created: now(),
        model: server.model_id.clone(),
    };
    let cancel = job.call.cancel.clone().unwrap_or_default();
    let result = if job.req.stream {
        stream(&mut pipe, &job, &meta, &cancel, out)
    } else {
        let watch = out.try_clone()?;
        let mut checked = Instant::now();
        let mut sink = |_: &str| {
            if checked.elapsed().as_millis() >= 50 {
                checked = Instant::now();
                if !http::peer_alive(&watch) {
                    cancel.store(true, Ordering::Relaxed);
                }
            }
        };
        Ok(pipe.call(&job.req.prompt, &job.call, Some(&mut sink)))
    };
    lock(&server.idle).push(pipe);
    match result? {
        Ok(o) => {
            let cancelled = o.finish_reason == FinishReason::Cancelled;
            server.metrics.generation(&o.stats, cancelled);
            if cancelled {
                server.metrics.request(499);
                return Ok(false);
            }
            if job.req.stream {
                server.metrics.request(200);
                finish_stream(&job, &meta, &o, out)?;
                Ok(false)
            } else {
                server.metrics.request(200);
                let body = api::response(&meta, chat, &o.text, &o).to_string();
                http::respond(out, 200, "application/json", body.as_bytes(), keep)?;
                Ok(keep)
            }
        }
        Err(e) => {
            let status = match e {
                augur::Error::InvalidOption(_) | augur::Error::PromptTooLong { .. } | augur::Error::ChatTemplate(_) => {
                    400
                }
                _ => 500,
            };
            let err = ApiError::bad(e.to_string());
            let err = if status == 500 { err.with(500, "server_error", "generation_failed") } else { err };
            server.metrics.request(status);
            if job.req.stream {
                http::event(out, &err.body())?;
                Ok(false)
            } else {
                http::respond(out, status, "application/json", err.body().as_bytes(), keep)?;
                Ok(keep)
            }
        }
    }
}

/// Streams the chunks as they are accepted; a failed write cancels the generation.
fn stream(
    pipe: &mut Pipeline,
    job: &Job,
    meta: &Meta,
    cancel: &AtomicBool,
    out: &mut TcpStream,
) -> std::io::Result<augur::Result<GenerationOutput>> {
    let chat = job.req.chat;
    http::start_events(out)?;
    let mut first = true;
    if chat {
        http::event(out, &api::chunk(meta, true, Some(""), true, None).to_string())?;
        first = false;
    }
    let mut sink = |text: &str| {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let c = api::chunk(meta, chat, Some(text), first, None).to_string();
        first = false;
        if http::event(out, &c).is_err() {
            cancel.store(true, Ordering::Relaxed);
        }
    };
    Ok(pipe.call(&job.req.prompt, &job.call, Some(&mut sink)))
}

fn finish_stream(job: &Job, meta: &Meta, o: &GenerationOutput, out: &mut TcpStream) -> std::io::Result<()> {
    let chat = job.req.chat;
    let reason = api::finish_reason(&o.finish_reason);
    http::event(out, &api::chunk(meta, chat, None, false, Some(reason)).to_string())?;
    if job.req.include_usage {
        http::event(out, &api::usage_chunk(meta, chat, o).to_string())?;
    }
    http::event(out, "[DONE]")
}
