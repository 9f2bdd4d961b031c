//! A started request's answer: its whole body once the sequence is done, or its server-sent events as the
//! sequence accepts text.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;

use crate::api;
use crate::api::Meta;
use crate::reply::{error, internal, json_reply, outputs, shutdown_error};
use crate::sequence::{CancelOnDrop, Msg};
use crate::state::Server;

/// What an answer looks like, as its request asked.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) chat: bool,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    pub(crate) n: usize,
    pub(crate) logprobs: Option<api::LogprobsAsked>,
}

/// The answer of a started request: its events, or its whole body once the sequence is done.
pub(crate) async fn answer(
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
