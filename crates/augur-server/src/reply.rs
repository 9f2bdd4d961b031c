//! Answers as responses: JSON bodies, API errors, and the engine's errors as API errors.

use anyhow::Result;
use augur::generation::output::GenerationOutput;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::api::ApiError;

pub(crate) fn error(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], e.body()).into_response()
}

pub(crate) fn json_reply(v: serde_json::Value) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// What an answer still running at the shutdown deadline ends with (its stream's last event, or a 503): the
/// text so far is not passed off as a whole answer.
pub(crate) fn shutdown_error() -> ApiError {
    ApiError::bad("the server shut down before this answer was complete").with(503, "server_error", "server_shutdown")
}

pub(crate) fn internal(message: &str) -> ApiError {
    ApiError::bad(message).with(500, "server_error", "internal_error")
}

/// 400 for what the request asked wrongly, 500 for what failed in the engine.
pub(crate) fn error_status(e: &augur::Error) -> u16 {
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
pub(crate) fn outputs(results: Vec<augur::Result<GenerationOutput>>) -> Result<Vec<GenerationOutput>, ApiError> {
    results.into_iter().map(|r| r.map_err(generation_error)).collect()
}
