//! OpenAI's request and response bodies, mapped onto the pipeline's prompt and options.

use augur::generation::config::GenerationOptions;
use augur::generation::method::MethodName;
use augur::generation::output::GenerationOutput;
use augur::generation::stopping::FinishReason;
use augur::pipeline::Prompt;
use augur::tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

/// An error answered with an OpenAI-style body `{"error": {message, type, param, code}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into(), kind: "invalid_request_error", param: None, code: None }
    }

    pub fn param(param: &'static str, message: impl Into<String>) -> Self {
        Self { param: Some(param), ..Self::bad(message) }
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
}

fn field<'a>(body: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    body.get(name).filter(|v| !v.is_null())
}

fn number(body: &Map<String, Value>, name: &'static str) -> Result<Option<f64>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::param(name, format!("`{name}` must be a number"))),
    }
}

fn count(body: &Map<String, Value>, name: &'static str) -> Result<Option<usize>, ApiError> {
    match field(body, name) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| ApiError::param(name, format!("`{name}` must be a non-negative integer"))),
    }
}

fn flag(body: &Map<String, Value>, name: &'static str) -> Result<bool, ApiError> {
    match field(body, name) {
        None => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| ApiError::param(name, format!("`{name}` must be a boolean"))),
    }
}

/// A chat message's `content`: a string or a list of `{"type": "text", "text": …}` parts.
fn content(v: Option<&Value>) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t.to_string()),
                _ => Err(ApiError::param("messages", "only text content parts are supported")),
            })
            .collect(),
        Some(_) => Err(ApiError::param("messages", "a message's `content` must be a string or a list of parts")),
    }
}

fn messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let list = v.and_then(Value::as_array).ok_or_else(|| ApiError::param("messages", "`messages` must be a list"))?;
    if list.is_empty() {
        return Err(ApiError::param("messages", "`messages` is empty"));
    }
    list.iter()
        .map(|m| {
            let role = m
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::param("messages", "every message needs a string `role`"))?;
            Ok(ChatMessage::new(role, content(m.get("content"))?))
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
    match method {
        "off" | "none" => return Ok(Speculation::Off),
        "default" => return Ok(Speculation::Default),
        _ => {}
    }
    let name: MethodName = method.parse().map_err(|e| bad(format!("speculation {e}")))?;
    let options = name.own_options(&options).map_err(|e| bad(format!("speculation {e}")))?;
    Ok(Speculation::Method(name, Box::new(options)))
}

/// Parses a request body. `chat` selects the chat-completions schema.
pub fn parse(body: &[u8], chat: bool) -> Result<CompletionRequest, ApiError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(body) = value else {
        return Err(ApiError::bad("the request body must be a JSON object"));
    };
    let model = match field(&body, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::param("model", "`model` must be a string")),
    };
    let prompt = if chat {
        Prompt::Chat(messages(body.get("messages"))?)
    } else {
        match field(&body, "prompt") {
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                Prompt::Text(a[0].as_str().unwrap_or_default().to_string())
            }
            Some(Value::Array(_)) => {
                return Err(ApiError::param(
                    "prompt",
                    "`prompt` must be one string (batches of prompts are not supported)",
                ))
            }
            _ => return Err(ApiError::param("prompt", "`prompt` must be a string")),
        }
    };
    if let Some(n) = count(&body, "n")? {
        if n != 1 {
            return Err(ApiError::param("n", "only `n` = 1 is supported"));
        }
    }
    for unsupported in ["logprobs", "top_logprobs", "tools", "best_of", "suffix"] {
        let set = match field(&body, unsupported) {
            None | Some(Value::Bool(false)) => false,
            Some(Value::Number(n)) if unsupported == "best_of" => n.as_u64() != Some(1),
            Some(_) => true,
        };
        if set {
            return Err(ApiError::bad(format!("`{unsupported}` is not supported")));
        }
    }
    for penalty in ["presence_penalty", "frequency_penalty"] {
        if number(&body, if penalty == "presence_penalty" { "presence_penalty" } else { "frequency_penalty" })?
            .is_some_and(|p| p != 0.0)
        {
            return Err(ApiError::bad(format!("`{penalty}` is not supported; use `repetition_penalty`")));
        }
    }
    let max_tokens = match count(&body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => count(&body, "max_tokens")?,
    };
    let mut options = GenerationOptions { max_new_tokens: max_tokens, ..Default::default() };
    if let Some(t) = number(&body, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::param("temperature", "`temperature` must be between 0 and 2"));
        }
        // OpenAI's temperature 0 means greedy; Transformers would reject it.
        options.do_sample = Some(t > 0.0);
        if t > 0.0 {
            options.temperature = Some(t as f32);
        }
    }
    if let Some(p) = number(&body, "top_p")? {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::param("top_p", "`top_p` must be greater than 0 and at most 1"));
        }
        options.top_p = Some(p as f32);
    }
    options.top_k = count(&body, "top_k")?;
    if let Some(p) = number(&body, "min_p")? {
        options.min_p = Some(p as f32);
    }
    if let Some(p) = number(&body, "repetition_penalty")? {
        options.repetition_penalty = Some(p as f32);
    }
    options.seed = match field(&body, "seed") {
        None => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| ApiError::param("seed", "`seed` must be a non-negative integer"))?),
    };
    options.stop_strings = match field(&body, "stop") {
        None => None,
        Some(Value::String(s)) => Some(vec![s.clone()]),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            Some(a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        }
        Some(_) => return Err(ApiError::param("stop", "`stop` must be a string or a list of strings")),
    }
    .filter(|s: &Vec<String>| !s.is_empty());
    if options.stop_strings.as_ref().is_some_and(|s| s.iter().any(String::is_empty)) {
        return Err(ApiError::param("stop", "stop strings must not be empty"));
    }
    // vLLM's extension: generate the full budget whatever EOS says (fixed-length benchmarks).
    if flag(&body, "ignore_eos")? {
        options.eos_token_id = Some(Vec::new());
    }
    let include_usage = match field(&body, "stream_options") {
        None => false,
        Some(o) => o.get("include_usage").and_then(Value::as_bool).unwrap_or(false),
    };
    Ok(CompletionRequest {
        chat,
        model,
        prompt,
        echo: !chat && flag(&body, "echo")?,
        options,
        speculation: speculation(field(&body, "speculation"))?,
        stream: flag(&body, "stream")?,
        include_usage,
    })
}

pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

/// `usage`, with the speculative statistics under `speculation`.
pub fn usage(out: &GenerationOutput) -> Value {
    let s = &out.stats;
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.new_tokens,
        "total_tokens": s.prompt_tokens + s.new_tokens,
        "speculation": {
            "method": s.method,
            "drafted_tokens": s.drafted,
            "accepted_tokens": s.accepted,
            "acceptance_rate": s.acceptance_rate,
            "target_forwards": s.target_forwards,
            "tokens_per_forward": s.mean_accepted_per_forward,
            "draft_seconds": s.draft_seconds,
            "verify_seconds": s.verify_seconds,
        },
    })
}

/// Identity of one response (`id`, `created`, `model`).
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// A whole (non-streamed) response.
pub fn response(meta: &Meta, chat: bool, text: &str, out: &GenerationOutput) -> Value {
    let finish = finish_reason(&out.finish_reason);
    let choice = if chat {
        let message = json!({"role": "assistant", "content": text});
        json!({"index": 0, "message": message, "logprobs": null, "finish_reason": finish})
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
    };
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage(out),
    })
}

/// One streamed chunk: `text` (or, for chats, a delta with `role` on the first chunk), or the final
/// `finish_reason`.
pub fn chunk(meta: &Meta, chat: bool, text: Option<&str>, first: bool, finish: Option<&str>) -> Value {
    let choice = if chat {
        let mut delta = Map::new();
        if first {
            delta.insert("role".into(), "assistant".into());
        }
        if let Some(t) = text {
            delta.insert("content".into(), t.into());
        }
        json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
    } else {
        json!({"index": 0, "text": text.unwrap_or_default(), "logprobs": null, "finish_reason": finish})
    };
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    })
}

/// The last chunk of a stream asked for `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(meta: &Meta, chat: bool, out: &GenerationOutput) -> Value {
    json!({
        "id": meta.id,
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [],
        "usage": usage(out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_fields_and_rejects_bad_ones() {
        let r = parse(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"temperature":0,"stop":"x","stream":true,
                 "speculation":{"method":"prompt_lookup","prompt_lookup_num_tokens":3}}"#,
            false,
        )
        .unwrap();
        assert_eq!(r.options.max_new_tokens, Some(5));
        assert_eq!(r.options.do_sample, Some(false));
        assert_eq!(r.options.stop_strings, Some(vec!["x".to_string()]));
        assert!(r.stream);
        match r.speculation {
            Speculation::Method(MethodName::PromptLookup, o) => assert_eq!(o.prompt_lookup_num_tokens, Some(3)),
            other => panic!("{other:?}"),
        }
        let chat = parse(br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}"#, true).unwrap();
        assert!(matches!(chat.prompt, Prompt::Chat(ref m) if m[0].content == "a"));
        for (bad, chat) in [
            (&br#"{"prompt": "#[..], false),
            (br#"[1,2]"#, false),
            (br#"{"prompt": 3}"#, false),
            (br#"{"prompt": "a", "max_tokens": -1}"#, false),
            (br#"{"prompt": "a", "n": 2}"#, false),
            (br#"{"prompt": "a", "temperature": "hot"}"#, false),
            (br#"{"prompt": "a", "speculation": {"method": "telepathy"}}"#, false),
            (br#"{"messages": []}"#, true),
            (br#"{"messages": [{"content": "no role"}]}"#, true),
        ] {
            let e = parse(bad, chat).expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(e.status, 400);
            let body: Value = serde_json::from_str(&e.body()).unwrap();
            assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }
}
