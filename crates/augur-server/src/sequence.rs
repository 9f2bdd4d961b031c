//! A generation request's engine side, on a thread of its own: the engine's admission and a sequence per
//! choice, the generations, and what they tell the handler.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use augur::generation::output::{GenerationOutput, TokenLogprob};
use augur::generation::stopping::FinishReason;
use augur::pipeline::{Pipeline, Sinks};
use tokio::sync::mpsc::UnboundedSender;

use crate::api;
use crate::api::{ApiError, CompletionRequest, Meta};
use crate::auth::Owner;
use crate::metrics;
use crate::reply::error_status;
use crate::state::{now, App, Server};
use crate::validation::{prepare, Job};

/// What a sequence's thread tells its handler.
pub(crate) enum Msg {
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
pub(crate) struct CancelOnDrop(pub(crate) Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A request's sequences: checks, admission, a fork per choice, the generations (on threads of their own when
/// `n` > 1, so that their forwards batch); every step reported through `tx`.
pub(crate) fn sequence(
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
    let engine = &server.engine;
    let Some(admitted) = engine.admit(n) else {
        let e = ApiError::bad(format!(
            "the server is busy: {} sequences running and {} waiting; retry later",
            engine.admission().slots(),
            engine.admission().queue()
        ))
        .with(429, "rate_limit_error", "queue_full");
        let _ = tx.send(Msg::Refused(e));
        return;
    };
    let queue = arrival.elapsed();
    if cancel.load(Ordering::Relaxed) {
        return; // the client left while it waited
    }
    let mut running = match admitted.sequences(&job.prompt_ids, &job.owner) {
        Ok(r) => r,
        Err(e) => {
            let _ = tx.send(Msg::Refused(ApiError::bad(e.to_string()).with(500, "server_error", "fork_failed")));
            return;
        }
    };
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
    // A choice's output, with the time of its first text. The choices run at once, so that their forwards batch.
    let ran = running.run(|index: usize, pipe: &mut Pipeline| {
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
            pipe.call_encoded_with(&job.req.prompt, &job.prompt_ids, &job.call_for(index), sinks)
        };
        let rest = pending.take();
        if !rest.is_empty() {
            send(rest, None);
        }
        out.map(|o| (o, first, arrival.elapsed()))
    });
    drop(running);
    for (o, first_token, total) in ran.iter().flatten() {
        let timings = metrics::Timings { queue, first_token: *first_token, total: *total };
        app.metrics.generation(&o.stats, o.finish_reason == FinishReason::Cancelled, &timings);
    }
    let results: Vec<_> = ran.into_iter().map(|r| r.map(|(o, ..)| o)).collect();
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
