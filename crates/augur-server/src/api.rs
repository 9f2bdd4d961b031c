//! OpenAI's request and response bodies, mapped onto the pipeline's prompt and options.
//!
//! [`RequestBody`] is the schema of both `/v1/completions` and `/v1/chat/completions`: every field of OpenAI's
//! two requests, vLLM's sampling extensions, and augur's `speculation`. Every field is either honoured or refused
//! with a 400 that names it; a field outside the schema is refused too, so nothing a client asks for is silently
//! dropped.

use std::collections::HashMap;

use augur::generation::config::GenerationOptions;
use augur::generation::output::{GenerationOutput, TokenLogprob};
use augur::generation::stopping::FinishReason;
use augur::pipeline::Prompt;
use augur::speculation::method::MethodName;
use augur::speculation::registry::Knob;
use augur::tokenizer::{ChatMessage, Tokenizer};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Map, Value};

/// An error answered with an OpenAI-style body `{"error": {message, type, param, code}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into(), kind: "invalid_request_error", param: None, code: None }
    }

    pub fn param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::bad(message) }
    }

    pub fn with(mut self, status: u16, kind: &'static str, code: &'static str) -> Self {
        self.status = status;
        self.kind = kind;
        self.code = Some(code);
        self
    }

    pub fn body(&self) -> String {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
            .to_string()
    }
}

/// OpenAI's limits: `top_logprobs` up to 20 (vLLM's too), a bias within ±100.
pub const MAX_TOP_LOGPROBS: usize = 20;
pub const MAX_LOGIT_BIAS: f64 = 100.0;
/// OpenAI's limit on `logit_bias` entries.
pub const MAX_LOGIT_BIAS_ENTRIES: usize = 300;
/// Stop strings per request and bytes per stop string: every token is checked against all of them.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 256;

/// Which speculation a request asks for, through the extra body field `speculation`.
#[derive(Debug, Clone, PartialEq)]
pub enum Speculation {
    /// The server's defaults (the field is absent or `"default"`).
    Default,
    /// Plain decoding (`"off"`, `false` or `{"method": "off"}`).
    Off,
    /// A named method with its options, as Transformers names them (only the method's own fields are kept).
    Method(MethodName, Box<GenerationOptions>),
}

/// One string or several (`stop`, `prompt`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `logprobs`: a boolean on chats, the number of alternatives on completions.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LogprobsField {
    Flag(bool),
    Count(u64),
}

/// A chat message's `content`: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part: only `text` parts are rendered; any other `type` (images, audio, files) is refused.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<Content>,
    pub name: Option<String>,
    pub tool_calls: Option<Value>,
    pub tool_call_id: Option<String>,
    pub function_call: Option<Value>,
    pub refusal: Option<String>,
    pub audio: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
    pub include_obfuscation: Option<bool>,
}

/// Both endpoints' request schema (see the module's doc). `null` is the same as an absent field.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestBody {
    pub model: Option<String>,
    // Completions only.
    pub prompt: Option<Value>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u64>,
    // Chats only.
    pub messages: Option<Vec<Message>>,
    pub top_logprobs: Option<u64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// Has no effect without `tools`, which are refused.
    #[serde(rename = "parallel_tool_calls")]
    _parallel_tool_calls: Option<bool>,
    pub functions: Option<Vec<Value>>,
    pub function_call: Option<Value>,
    pub response_format: Option<Value>,
    pub modalities: Option<Vec<String>>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub reasoning_effort: Option<String>,
    pub web_search_options: Option<Value>,
    pub verbosity: Option<String>,
    pub store: Option<bool>,
    /// Tags for OpenAI's dashboard: accepted, nothing to do.
    #[serde(rename = "metadata")]
    _metadata: Option<IgnoredAny>,
    pub service_tier: Option<String>,
    /// Hints for OpenAI's cache and abuse checks: accepted, nothing to do (the identifier is logged like `user`).
    #[serde(rename = "prompt_cache_key")]
    _prompt_cache_key: Option<String>,
    pub safety_identifier: Option<String>,
    // Both.
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<u64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub stop: Option<OneOrMany>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub logit_bias: Option<HashMap<String, f64>>,
    pub logprobs: Option<LogprobsField>,
    pub seed: Option<i64>,
    pub user: Option<String>,
    // vLLM's extensions.
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_tokens: Option<u64>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    // llama-server's.
    pub cache_prompt: Option<bool>,
    // augur's.
    pub speculation: Option<Value>,
}

/// `/tokenize`'s body: vLLM's fields (`prompt` or `messages`) and llama.cpp's (`content`, `add_special`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub content: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub add_special_tokens: Option<bool>,
    pub add_special: Option<bool>,
    pub add_generation_prompt: Option<bool>,
}

/// `/detokenize`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

/// How a response reports log-probabilities: chats' `{"content": [...]}` or completions' legacy columns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogprobsAsked {
    /// Alternatives per token.
    pub top: usize,
}

/// A parsed `/v1/completions` or `/v1/chat/completions` request.
#[derive(Debug)]
pub struct CompletionRequest {
    pub chat: bool,
    pub model: Option<String>,
    pub prompt: Prompt,
    /// `echo` on completions: the prompt comes back ahead of the new text.
    pub echo: bool,
    /// Sampling and length options (no speculation: that is in `speculation`).
    pub options: GenerationOptions,
    pub speculation: Speculation,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices generated for the prompt (`n`), each its own sequence.
    pub n: usize,
    pub logprobs: Option<LogprobsAsked>,
    /// Keep the stop string in the text (vLLM's `include_stop_str_in_output`; OpenAI cuts it).
    pub include_stop: bool,
    /// Token ids that end a choice besides the model's EOS (vLLM's `stop_token_ids`).
    pub stop_token_ids: Vec<u32>,
    /// Generate the whole budget whatever EOS says (vLLM's `ignore_eos`; `stop_token_ids` still stop).
    pub ignore_eos: bool,
    /// The end user the client names; it goes into the request log.
    pub user: Option<String>,
    /// Reuse an idle sequence's cached prefix of the prompt (llama-server's `cache_prompt`, on unless false).
    pub cache_prompt: bool,
}

/// Deserialises `body` into `T`, naming the field at fault (`messages[0].role`) in the error.
pub fn typed<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::bad(format!("the request body is not valid JSON: {inner}"));
        }
        let message = inner.to_string();
        // serde's "unknown field `x`, expected one of …" lists the whole schema; the field is what matters.
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let field = rest.split('`').next().unwrap_or_default();
            // The path ends at the unknown field itself.
            let at = if path == "." || path.is_empty() { field.to_string() } else { path };
            return ApiError::param(at.clone(), format!("unknown field `{at}`: augur does not support it"));
        }
        let message = message.split(" at line ").next().unwrap_or(&message).to_string();
        if path == "." {
            ApiError::bad(format!("the request body must be a JSON object with the request's fields: {message}"))
        } else {
            ApiError::param(path.clone(), format!("`{path}`: {message}"))
        }
    })
}

fn refuse(field: &str, why: &str) -> ApiError {
    ApiError::param(field, format!("`{field}` {why}"))
}

/// A chat message's text.
fn content(i: usize, c: Option<Content>) -> Result<String, ApiError> {
    match c {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s),
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .enumerate()
            .map(|(j, p)| match (p.kind.as_str(), p.text) {
                ("text", Some(t)) => Ok(t),
                (kind, _) => Err(refuse(
                    &format!("messages[{i}].content[{j}]"),
                    &format!(
                        "is a `{kind}` part; only text parts (`{{\"type\": \"text\", \"text\": …}}`) are supported"
                    ),
                )),
            })
            .collect(),
    }
}

/// A chat's messages, each refused (naming it) where it asks for what the chat template cannot render.
pub fn chat_messages(list: Vec<Message>) -> Result<Vec<ChatMessage>, ApiError> {
    if list.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let at = |f: &str| format!("messages[{i}].{f}");
            if m.role == "tool" || m.role == "function" {
                return Err(refuse(&at("role"), &format!("`{}`: tool calling is not supported", m.role)));
            }
            for (set, field) in [
                (m.tool_calls.is_some() || m.function_call.is_some(), "tool_calls"),
                (m.tool_call_id.is_some(), "tool_call_id"),
                (m.audio.is_some(), "audio"),
            ] {
                if set {
                    return Err(refuse(&at(field), "is not supported: tool calling and audio are not"));
                }
            }
            if m.name.is_some() {
                return Err(refuse(&at("name"), "is not supported: chat templates here render no participant names"));
            }
            let text = content(i, m.content)?;
            // An assistant's refusal is its message text (OpenAI sends one or the other).
            let text = match m.refusal {
                Some(r) if text.is_empty() => r,
                _ => text,
            };
            Ok(ChatMessage::new(m.role, text))
        })
        .collect()
}

fn speculation(v: Option<&Value>) -> Result<Speculation, ApiError> {
    let bad = |m: String| ApiError::param("speculation", m);
    let obj = match v {
        None | Some(Value::Null) => return Ok(Speculation::Default),
        Some(Value::Bool(false)) => return Ok(Speculation::Off),
        Some(Value::String(s)) if s == "off" || s == "none" => return Ok(Speculation::Off),
        Some(Value::String(s)) if s == "default" => return Ok(Speculation::Default),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(bad(format!(
                "`speculation` must be \"off\", \"default\" or an object with a `method`, not {other}"
            )))
        }
    };
    let method = obj.get("method").and_then(Value::as_str).unwrap_or_default();
    let options = GenerationOptions::from_json_map(obj).map_err(|e| bad(e.to_string()))?;
    let (speculation, own) = match method {
        "off" | "none" => (Speculation::Off, GenerationOptions::default()),
        "default" => (Speculation::Default, GenerationOptions::default()),
        _ => {
            let name: MethodName = method.parse().map_err(|e| bad(format!("speculation {e}")))?;
            let own = name.own_options(&options).map_err(|e| bad(format!("speculation {e}")))?;
            (Speculation::Method(name, Box::new(own.clone())), own)
        }
    };
    // A key the method does not read (misspelt, another method's, a sampling field) would be dropped silently.
    let read = serde_json::to_value(&own).unwrap_or_default();
    if let Some(key) =
        obj.keys().find(|k| *k != "method" && !obj[k.as_str()].is_null() && read.get(k.as_str()).is_none())
    {
        let at = format!("speculation.{key}");
        return Err(ApiError::param(
            at.clone(),
            format!("`{at}` is not an option of speculation method `{method}` (see the README's request fields)"),
        ));
    }
    check_knobs(&own)?;
    Ok(speculation)
}

/// Bounds on the per-request speculation knobs, as the registry gives them: a number past them only makes every
/// round's forward longer.
pub fn check_knobs(o: &GenerationOptions) -> Result<(), ApiError> {
    for knob in Knob::all() {
        if let (Some(max), Some(value)) = (knob.max, (knob.count)(o)) {
            if value > max {
                let name = knob.name;
                return Err(ApiError::param(
                    format!("speculation.{name}"),
                    format!("`speculation.{name}` must be at most {max}, not {value}"),
                ));
            }
        }
    }
    Ok(())
}

fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// The fields OpenAI defines that ask for what augur does not do; each refused unless it asks for nothing.
fn refuse_unsupported(b: &RequestBody) -> Result<(), ApiError> {
    let no_tools = "tool calling is not supported";
    if b.tools.as_ref().is_some_and(|t| !t.is_empty()) || b.functions.as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(refuse(if b.tools.is_some() { "tools" } else { "functions" }, &format!("is set: {no_tools}")));
    }
    for (field, choice) in [("tool_choice", &b.tool_choice), ("function_call", &b.function_call)] {
        match choice {
            None => {}
            Some(Value::String(s)) if s == "none" => {}
            Some(other) => return Err(refuse(field, &format!("{other} is not supported: only \"none\" ({no_tools})"))),
        }
    }
    if let Some(f) = &b.response_format {
        if f.get("type").and_then(Value::as_str) != Some("text") {
            return Err(refuse(
                "response_format",
                &format!("{f} is not supported: only {{\"type\": \"text\"}} (no JSON mode or schemas)"),
            ));
        }
    }
    for (field, value) in [("presence_penalty", b.presence_penalty), ("frequency_penalty", b.frequency_penalty)] {
        if value.is_some_and(|p| p != 0.0) {
            return Err(refuse(field, "is not supported (only 0); `repetition_penalty` is"));
        }
    }
    if b.modalities.as_ref().is_some_and(|m| m.iter().any(|m| m != "text")) {
        return Err(refuse("modalities", "may only be [\"text\"]"));
    }
    for (set, field, why) in [
        (b.audio.is_some(), "audio", "is not supported: output is text only"),
        (b.prediction.is_some(), "prediction", "is not supported; augur drafts on its own (see `speculation`)"),
        (b.reasoning_effort.is_some(), "reasoning_effort", "is not supported"),
        (b.web_search_options.is_some(), "web_search_options", "is not supported"),
        (b.verbosity.is_some(), "verbosity", "is not supported"),
        (b.store == Some(true), "store", "is not supported: nothing is stored"),
        (b.suffix.as_ref().is_some_and(|s| !s.is_empty()), "suffix", "is not supported (no fill-in-the-middle)"),
        (b.skip_special_tokens == Some(false), "skip_special_tokens", "false is not supported"),
        (
            b.stream_options.as_ref().is_some_and(|o| o.include_obfuscation == Some(true)),
            "stream_options.include_obfuscation",
            "is not supported",
        ),
    ] {
        if set {
            return Err(refuse(field, why));
        }
    }
    if let Some(tier) = b.service_tier.as_deref().filter(|t| !matches!(*t, "auto" | "default")) {
        return Err(refuse("service_tier", &format!("`{tier}` is not supported: only \"auto\" or \"default\"")));
    }
    Ok(())
}

/// Fields that belong to the other endpoint.
fn endpoint_fields(b: &RequestBody, chat: bool) -> Result<(), ApiError> {
    let (this, other) =
        if chat { ("/v1/chat/completions", "/v1/completions") } else { ("/v1/completions", "/v1/chat/completions") };
    let foreign: &[(bool, &str)] = if chat {
        &[
            (b.prompt.is_some(), "prompt"),
            (b.echo.is_some(), "echo"),
            (b.suffix.is_some(), "suffix"),
            (b.best_of.is_some(), "best_of"),
        ]
    } else {
        &[
            (b.messages.is_some(), "messages"),
            (b.top_logprobs.is_some(), "top_logprobs"),
            (b.tools.is_some(), "tools"),
            (b.tool_choice.is_some(), "tool_choice"),
            (b.response_format.is_some(), "response_format"),
            (b.max_completion_tokens.is_some(), "max_completion_tokens"),
        ]
    };
    match foreign.iter().find(|(set, _)| *set) {
        Some((_, field)) => Err(refuse(field, &format!("belongs to {other}, not {this}"))),
        None => Ok(()),
    }
}

fn text_prompt(v: Option<Value>) -> Result<Prompt, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(Prompt::Text(s)),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(_)) => Err(ApiError::param(
            "prompt",
            "`prompt` must be one string (batches of prompts and token-id prompts are not supported; use `n` for \
             several choices)",
        )),
        None | Some(Value::Null) => Err(ApiError::param("prompt", "`prompt` is required")),
        Some(_) => Err(ApiError::param("prompt", "`prompt` must be a string")),
    }
}

/// Parses a request body. `chat` selects the chat-completions endpoint.
pub fn parse(body: &[u8], chat: bool) -> Result<CompletionRequest, ApiError> {
    let mut b: RequestBody = typed(body)?;
    endpoint_fields(&b, chat)?;
    refuse_unsupported(&b)?;
    let prompt = if chat {
        Prompt::Chat(chat_messages(
            b.messages.take().ok_or_else(|| ApiError::param("messages", "`messages` is required"))?,
        )?)
    } else {
        text_prompt(b.prompt.take())?
    };
    let n = as_usize(b.n.unwrap_or(1));
    if n == 0 {
        return Err(refuse("n", "must be at least 1"));
    }
    if let Some(best) = b.best_of.filter(|&best| as_usize(best) != n) {
        return Err(refuse("best_of", &format!("{best} is not supported: only `best_of` equal to `n` ({n})")));
    }
    let max_tokens = b.max_completion_tokens.or(b.max_tokens).map(as_usize);
    let mut options = GenerationOptions { max_new_tokens: max_tokens, ..Default::default() };
    if max_tokens == Some(0) {
        return Err(refuse(
            if b.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" },
            "must be at least 1",
        ));
    }
    if let Some(t) = b.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(refuse("temperature", "must be between 0 and 2"));
        }
        // OpenAI's temperature 0 means greedy; Transformers would reject it.
        options.do_sample = Some(t > 0.0);
        if t > 0.0 {
            options.temperature = Some(t as f32);
        }
    }
    if let Some(p) = b.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(refuse("top_p", "must be greater than 0 and at most 1"));
        }
        options.top_p = Some(p as f32);
    }
    options.top_k = match b.top_k {
        None => None,
        // vLLM's "off": -1 (and 0).
        Some(-1 | 0) => Some(0),
        Some(k) if k > 0 => Some(as_usize(k as u64)),
        Some(k) => {
            return Err(refuse("top_k", &format!("must be a positive integer, or -1 or 0 for no top-k, not {k}")))
        }
    };
    if let Some(p) = b.min_p {
        if !(0.0..=1.0).contains(&p) {
            return Err(refuse("min_p", "must be between 0 and 1"));
        }
        options.min_p = Some(p as f32);
    }
    if let Some(p) = b.repetition_penalty {
        if !(p > 0.0 && p.is_finite()) {
            return Err(refuse("repetition_penalty", "must be a positive number"));
        }
        options.repetition_penalty = Some(p as f32);
    }
    options.min_new_tokens = b.min_tokens.map(as_usize);
    if let (Some(min), Some(max)) = (options.min_new_tokens, max_tokens) {
        if min > max {
            return Err(refuse("min_tokens", &format!("({min}) must not be greater than `max_tokens` ({max})")));
        }
    }
    // Any 64-bit integer seeds the sampler, as OpenAI takes any.
    options.seed = b.seed.map(|s| s as u64);
    options.stop_strings = match b.stop.take() {
        None => None,
        Some(OneOrMany::One(s)) => Some(vec![s]),
        Some(OneOrMany::Many(v)) => Some(v),
    }
    .filter(|s| !s.is_empty());
    let stops = options.stop_strings.as_deref().unwrap_or_default();
    if stops.iter().any(String::is_empty) {
        return Err(refuse("stop", "must not contain an empty string"));
    }
    if stops.len() > MAX_STOP_STRINGS {
        return Err(refuse("stop", &format!("has {} strings; at most {MAX_STOP_STRINGS} are allowed", stops.len())));
    }
    if let Some(long) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(refuse(
            "stop",
            &format!("strings may be at most {MAX_STOP_BYTES} bytes long; one is {} bytes", long.len()),
        ));
    }
    if let Some(bias) = b.logit_bias.as_ref().filter(|b| b.len() > MAX_LOGIT_BIAS_ENTRIES) {
        return Err(refuse(
            "logit_bias",
            &format!("has {} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are allowed", bias.len()),
        ));
    }
    if let Some(bias) = &b.logit_bias {
        let mut biases = Vec::with_capacity(bias.len());
        for (token, &value) in bias {
            let id: u32 = token.parse().map_err(|_| {
                refuse("logit_bias", &format!("keys must be token ids (non-negative integers), not {token:?}"))
            })?;
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&value) {
                return Err(refuse("logit_bias", &format!("values must be between -100 and 100, not {value}")));
            }
            biases.push((vec![id], value as f32));
        }
        biases.sort_by_key(|(ids, _)| ids[0]);
        options.sequence_bias = Some(biases).filter(|b| !b.is_empty());
    }
    let stream = b.stream.unwrap_or(false);
    let logprobs = match (chat, b.logprobs.take(), b.top_logprobs) {
        (_, None | Some(LogprobsField::Flag(false)), None) => None,
        (true, None | Some(LogprobsField::Flag(false)), Some(_)) => {
            return Err(refuse("top_logprobs", "needs `logprobs: true`"))
        }
        (true, Some(LogprobsField::Flag(true)), top) => Some(as_usize(top.unwrap_or(0))),
        (false, Some(LogprobsField::Count(k)), _) => Some(as_usize(k)),
        (true, Some(LogprobsField::Count(_)), _) => return Err(refuse("logprobs", "must be a boolean on chats")),
        (false, Some(LogprobsField::Flag(_)), _) | (false, None, _) => {
            return Err(refuse("logprobs", "must be a number of alternatives (0 to 20) on completions"))
        }
    };
    let top_field = if chat { "top_logprobs" } else { "logprobs" };
    if logprobs.is_some_and(|k| k > MAX_TOP_LOGPROBS) {
        return Err(refuse(top_field, &format!("must be at most {MAX_TOP_LOGPROBS}")));
    }
    let echo = !chat && b.echo.unwrap_or(false);
    if logprobs.is_some() && echo {
        return Err(refuse("logprobs", "is not supported with `echo` (no prompt log-probabilities)"));
    }
    if b.stream_options.is_some() && !stream {
        return Err(refuse("stream_options", "is only allowed with `stream: true`"));
    }
    let speculation = speculation(b.speculation.as_ref())?;
    Ok(CompletionRequest {
        chat,
        model: b.model,
        prompt,
        echo,
        options,
        speculation,
        stream,
        include_usage: b.stream_options.and_then(|o| o.include_usage).unwrap_or(false),
        n,
        logprobs: logprobs.map(|top| LogprobsAsked { top }),
        include_stop: b.include_stop_str_in_output.unwrap_or(false),
        stop_token_ids: b.stop_token_ids.unwrap_or_default(),
        ignore_eos: b.ignore_eos.unwrap_or(false),
        user: b.user.or(b.safety_identifier),
        cache_prompt: b.cache_prompt.unwrap_or(true),
    })
}

/// OpenAI's reason: `"stop"` for EOS, a stop string or a stop token, `"length"` for the budget.
pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// `usage` over every choice, with the speculative statistics summed under `speculation`.
pub fn usage(outs: &[GenerationOutput]) -> Value {
    let prompt = outs.first().map_or(0, |o| o.stats.prompt_tokens);
    let sum = |f: fn(&GenerationOutput) -> usize| outs.iter().map(f).sum::<usize>();
    let sum_f = |f: fn(&GenerationOutput) -> f64| outs.iter().map(f).sum::<f64>();
    let completion = sum(|o| o.stats.new_tokens);
    let (drafted, accepted, forwards) =
        (sum(|o| o.stats.drafted), sum(|o| o.stats.accepted), sum(|o| o.stats.target_forwards));
    let mut sources = std::collections::BTreeMap::<&str, usize>::new();
    for (source, rounds) in outs.iter().flat_map(|o| &o.stats.draft_sources) {
        *sources.entry(source).or_default() += rounds;
    }
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        // OpenAI's: prompt tokens read from the cache of an earlier request instead of prefilled, the first
        // choice's (each choice runs on a sequence of its own, which may hold less of the prompt).
        "prompt_tokens_details": {"cached_tokens": outs.first().map_or(0, |o| o.stats.cached_prompt_tokens)},
        "speculation": {
            "method": outs.first().map(|o| o.stats.method.as_str()),
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": if drafted > 0 { accepted as f64 / drafted as f64 } else { 0.0 },
            "target_forwards": forwards,
            "tokens_per_forward": if forwards > 0 { completion as f64 / forwards as f64 } else { 0.0 },
            "draft_seconds": sum_f(|o| o.stats.draft_seconds),
            "verify_seconds": sum_f(|o| o.stats.verify_seconds),
            "tree_rounds": sum(|o| o.stats.tree_rounds),
            // Suffix decoding and `auto`: rounds by where their drafts came from (`request`, `cache`,
            // `assistant`).
            "draft_sources": sources,
            // Choices whose assistant's context filled up, so that they decoded plainly from there.
            "context_fallbacks": outs.iter().filter(|o| o.stats.context_fallback_at.is_some()).count(),
        },
    })
}

/// llama-server's `timings` for the first choice (each choice runs on a sequence of its own, as for
/// `cached_tokens`): `prompt` is the first forward (the prompt tokens not read from the cache, and the first new
/// token), `predicted` the new tokens after it and the time after it, so that `predicted_per_second` is the
/// engine's own decode rate, which a client can set against the rate at which the text reached it.
pub fn timings(outs: &[GenerationOutput]) -> Value {
    let Some(stats) = outs.first().map(|o| &o.stats) else { return Value::Null };
    let prompt_n = stats.prompt_tokens.saturating_sub(stats.cached_prompt_tokens);
    let predicted_n = stats.new_tokens.saturating_sub(1);
    let (prompt_ms, predicted_ms) = (stats.prefill_seconds * 1e3, (stats.seconds - stats.prefill_seconds) * 1e3);
    let per = |n: usize, ms: f64| if n > 0 { (ms / n as f64, n as f64 * 1e3 / ms) } else { (0.0, 0.0) };
    let ((prompt_per_token_ms, prompt_per_second), (predicted_per_token_ms, predicted_per_second)) =
        (per(prompt_n, prompt_ms), per(predicted_n, predicted_ms));
    json!({
        "cache_n": stats.cached_prompt_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_per_token_ms,
        "prompt_per_second": prompt_per_second,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_per_token_ms,
        "predicted_per_second": predicted_per_second,
    })
}

/// Identity of one response (`id`, `created`, `model`).
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// A token's text (decoded alone; U+FFFD where it holds part of a character) and its own bytes.
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    (tokenizer.decode(&[id], false).unwrap_or_default(), tokenizer.token_bytes(id))
}

/// A choice's `logprobs` (or a streamed chunk's): chats' `{"content": [...]}` or completions' `tokens` /
/// `token_logprobs` / `top_logprobs` / `text_offset` columns, the offsets counted from `text_offset`, which
/// is moved past these tokens' bytes.
pub fn logprobs(tokenizer: &Tokenizer, chat: bool, entries: &[TokenLogprob], text_offset: &mut usize) -> Value {
    if chat {
        let entry = |id: u32, lp: f32| {
            let (token, bytes) = token_text(tokenizer, id);
            json!({"token": token, "logprob": lp, "bytes": bytes})
        };
        let content: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut v = entry(e.token, e.logprob);
                v["top_logprobs"] = e.top.iter().map(|&(t, lp)| entry(t, lp)).collect();
                v
            })
            .collect();
        return json!({"content": content});
    }
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for e in entries {
        let (text, bytes) = token_text(tokenizer, e.token);
        offsets.push(*text_offset);
        *text_offset += bytes.len();
        tokens.push(text);
        lps.push(e.logprob);
        // Keyed by text, as OpenAI's legacy format is: of two tokens with the same text, the likelier stays.
        let mut top = Map::new();
        for &(t, lp) in &e.top {
            top.entry(token_text(tokenizer, t).0).or_insert(json!(lp));
        }
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// One choice of a whole response.
pub struct Choice<'a> {
    pub text: &'a str,
    pub out: &'a GenerationOutput,
    /// The choice's `logprobs` value (`null` unless asked for).
    pub logprobs: Value,
}

/// A whole (non-streamed) response.
pub fn response(meta: &Meta, chat: bool, choices: &[Choice<'_>], outs: &[GenerationOutput]) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let finish = finish_reason(&c.out.finish_reason);
            if chat {
                let message = json!({"role": "assistant", "content": c.text});
                json!({"index": index, "message": message, "logprobs": c.logprobs, "finish_reason": finish})
            } else {
                json!({"index": index, "text": c.text, "logprobs": c.logprobs, "finish_reason": finish})
            }
        })
        .collect();
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(outs),
        "timings": timings(outs),
    })
}

/// One streamed chunk of choice `index`: `text` (or, for chats, a delta with `role` on the first chunk) with
/// the log-probabilities of the tokens accepted with it, or the final `finish_reason`.
pub fn chunk(
    meta: &Meta,
    chat: bool,
    index: usize,
    text: Option<&str>,
    logprobs: Option<Value>,
    first: bool,
    finish: Option<&str>,
) -> Value {
    let logprobs = logprobs.unwrap_or(Value::Null);
    let choice = if chat {
        let mut delta = Map::new();
        if first {
            delta.insert("role".into(), "assistant".into());
        }
        if let Some(t) = text {
            delta.insert("content".into(), t.into());
        }
        json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
    } else {
        json!({"index": index, "text": text.unwrap_or_default(), "logprobs": logprobs, "finish_reason": finish})
    };
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    })
}

/// The last chunk of a stream asked for `stream_options.include_usage`: no choices, the usage and the timings.
pub fn usage_chunk(meta: &Meta, chat: bool, outs: &[GenerationOutput]) -> Value {
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage(outs),
        "timings": timings(outs),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str, chat: bool) -> ApiError {
        parse(body.as_bytes(), chat).expect_err(body)
    }

    #[test]
    fn parses_openai_fields() {
        let r = parse(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"x","stream":true,"top_k":-1,
                 "min_tokens":2,"seed":-3,"user":"u1","stop_token_ids":[7],"logit_bias":{"12":-100,"3":5.5},
                 "stream_options":{"include_usage":true},"n":2,"best_of":2,"presence_penalty":0,
                 "speculation":{"method":"prompt_lookup","prompt_lookup_num_tokens":3}}"#,
            false,
        )
        .unwrap();
        assert_eq!(r.options.max_new_tokens, Some(5));
        assert_eq!(r.options.do_sample, Some(false));
        assert_eq!(r.options.stop_strings, Some(vec!["x".to_string()]));
        assert_eq!((r.options.top_k, r.options.min_new_tokens, r.options.seed), (Some(0), Some(2), Some(-3i64 as u64)));
        assert_eq!(r.options.sequence_bias, Some(vec![(vec![3], 5.5), (vec![12], -100.0)]));
        assert_eq!((r.n, r.stop_token_ids.as_slice(), r.user.as_deref()), (2, &[7u32][..], Some("u1")));
        assert!(r.stream && r.include_usage && !r.include_stop);
        match r.speculation {
            Speculation::Method(MethodName::PromptLookup, o) => assert_eq!(o.prompt_lookup_num_tokens, Some(3)),
            other => panic!("{other:?}"),
        }
        let chat = parse(
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"logprobs":true,
                 "top_logprobs":4,"tool_choice":"none","response_format":{"type":"text"}}"#,
            true,
        )
        .unwrap();
        assert!(matches!(chat.prompt, Prompt::Chat(ref m) if m[0].content == "a"));
        assert_eq!(chat.logprobs, Some(LogprobsAsked { top: 4 }));
        let legacy = parse(br#"{"prompt":["one"],"logprobs":2}"#, false).unwrap();
        assert_eq!(legacy.logprobs, Some(LogprobsAsked { top: 2 }));
    }

    /// Each refusal names its field, and says why.
    #[test]
    fn refuses_what_it_cannot_honour_naming_the_field() {
        for (body, chat, param) in [
            (r#"{"prompt": "a", "frobnicate": 1}"#, false, "frobnicate"),
            (r#"{"messages": [{"role": "user", "content": "a", "mood": 1}]}"#, true, "messages[0].mood"),
            (r#"{"prompt": "a", "temperature": "hot"}"#, false, "temperature"),
            (r#"{"prompt": "a", "max_tokens": -1}"#, false, "max_tokens"),
            (r#"{"prompt": "a", "max_tokens": 184467440737095516150}"#, false, "max_tokens"),
            (r#"{"prompt": "a", "n": 0}"#, false, "n"),
            (r#"{"prompt": "a", "n": 2, "best_of": 3}"#, false, "best_of"),
            (r#"{"prompt": "a", "top_k": -2}"#, false, "top_k"),
            (r#"{"prompt": "a", "presence_penalty": 0.5}"#, false, "presence_penalty"),
            (r#"{"prompt": "a", "frequency_penalty": -1}"#, false, "frequency_penalty"),
            (r#"{"prompt": "a", "logit_bias": {"x": 1}}"#, false, "logit_bias"),
            (r#"{"prompt": "a", "logit_bias": {"5": 101}}"#, false, "logit_bias"),
            (r#"{"prompt": "a", "logprobs": 21}"#, false, "logprobs"),
            (r#"{"prompt": "a", "logprobs": 1, "echo": true}"#, false, "logprobs"),
            (r#"{"prompt": "a", "suffix": "b"}"#, false, "suffix"),
            (r#"{"prompt": "a", "messages": []}"#, false, "messages"),
            (r#"{"prompt": ["a", "b"]}"#, false, "prompt"),
            (r#"{"prompt": "a", "stream_options": {"include_usage": true}}"#, false, "stream_options"),
            (r#"{"prompt": "a", "speculation": {"method": "telepathy"}}"#, false, "speculation"),
            (
                r#"{"prompt": "a", "speculation": {"method": "prompt_lookup", "prompt_lookup_num_tokens": 100000}}"#,
                false,
                "speculation.prompt_lookup_num_tokens",
            ),
            (
                r#"{"prompt": "a", "speculation": {"method": "prompt_lookup", "max_matching_ngram_size": 1000}}"#,
                false,
                "speculation.max_matching_ngram_size",
            ),
            (r#"{"messages": []}"#, true, "messages"),
            (r#"{"messages": [{"content": "no role"}]}"#, true, "messages[0]"),
            (r#"{"messages": [{"role": "tool", "content": "x"}]}"#, true, "messages[0].role"),
            (r#"{"messages": [{"role": "user", "content": "x", "name": "bob"}]}"#, true, "messages[0].name"),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}"#,
                true,
                "messages[0].content[0]",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#, true, "tools"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tool_choice": "auto"}"#, true, "tool_choice"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
                true,
                "response_format",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#, true, "top_logprobs"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": 3}"#, true, "logprobs"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "echo": true}"#, true, "echo"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "store": true}"#, true, "store"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "modalities": ["audio"]}"#, true, "modalities"),
        ] {
            let e = err(body, chat);
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert!(e.message.contains(param.split('.').next_back().unwrap_or(param)), "{body}: {}", e.message);
        }
        for bad in [&b"{\"prompt\": "[..], b"[1,2]", b"\xff\xfe"] {
            let e = parse(bad, false).unwrap_err();
            assert_eq!(e.status, 400);
            let body: Value = serde_json::from_str(&e.body()).unwrap();
            assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    /// The limits a request is held to, each a 400 that names its field: OpenAI's 300 `logit_bias` entries, 16
    /// stop strings of at most 256 bytes, keys that the speculation method does not read, `min_tokens` above
    /// `max_tokens`.
    #[test]
    fn request_limits_are_400s_naming_the_field() {
        let bias: Map<String, Value> = (0..301).map(|i| (i.to_string(), json!(1))).collect();
        let many_stops: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
        for (body, param) in [
            (json!({"prompt": "a", "logit_bias": bias}), "logit_bias"),
            (json!({"prompt": "a", "stop": many_stops}), "stop"),
            (json!({"prompt": "a", "stop": ["x".repeat(257)]}), "stop"),
            (
                json!({"prompt": "a", "speculation": {"method": "prompt_lookup", "prompt_lookup_num_token": 3}}),
                "speculation.prompt_lookup_num_token",
            ),
            (
                json!({"prompt": "a", "speculation": {"method": "prompt_lookup", "num_assistant_tokens": 3}}),
                "speculation.num_assistant_tokens",
            ),
            (
                json!({"prompt": "a", "speculation": {"method": "assistant_model", "temperature": 0.5}}),
                "speculation.temperature",
            ),
            (
                json!({"prompt": "a", "speculation": {"method": "off", "prompt_lookup_num_tokens": 3}}),
                "speculation.prompt_lookup_num_tokens",
            ),
            (json!({"prompt": "a", "min_tokens": 9, "max_tokens": 8}), "min_tokens"),
        ] {
            let e = err(&body.to_string(), false);
            assert_eq!((e.status, e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
            assert!(e.message.contains(param), "{body}: {}", e.message);
        }
        let bias: Map<String, Value> = (0..300).map(|i| (i.to_string(), json!(1))).collect();
        let ok = json!({"prompt": "a", "logit_bias": bias, "stop": vec!["y".repeat(256); 16], "min_tokens": 8,
                        "max_tokens": 8, "speculation": {"method": "prompt_lookup", "max_matching_ngram_size": 3}});
        parse(ok.to_string().as_bytes(), false).expect("at the limits");
    }
}
