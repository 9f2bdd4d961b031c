//! API keys: which key a request presents (compared in constant time), and the middleware that refuses a
//! request without one and counts and logs every answer.

use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::Response;

use crate::api::ApiError;
use crate::reply::error;
use crate::state::Shared;
use crate::ServeConfig;

/// Compares in time that depends only on the lengths, so that a client cannot find the key byte by byte from
/// how long the refusals take.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The keys of `--api-key`, comma-separated.
pub(crate) fn api_keys(config: &ServeConfig) -> Vec<String> {
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
pub(crate) struct Owner(pub(crate) String);

/// Marks a generation's response: its sequence writes the request's log line when it ends, with the tokens.
#[derive(Clone, Copy)]
pub(crate) struct LoggedBySequence;

/// The API key (every endpoint but `/health`), the count of answers by status, and the log line of every
/// request that is not a generation's.
pub(crate) async fn guard(State(app): State<Shared>, mut req: Request, next: Next) -> Response {
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
