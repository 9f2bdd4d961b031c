//! The HTTP surface: the router (every endpoint, its methods, the body limit and timeout, CORS) and its
//! handlers.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use serde_json::json;
use tokio::sync::mpsc::unbounded_channel;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::RequestBodyTimeoutLayer;

use crate::api;
use crate::api::ApiError;
use crate::auth::{guard, LoggedBySequence, Owner};
use crate::reply::{error, internal, json_reply};
use crate::sequence::{sequence, CancelOnDrop, Msg};
use crate::state::Shared;
use crate::streaming::{answer, Shape};
use crate::ServeConfig;

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

pub(crate) fn router(app: Shared, config: &ServeConfig) -> Result<Router> {
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
    let (active, queued) = app.server.get().map_or((0, 0), |s| s.engine.admission().gauges());
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
