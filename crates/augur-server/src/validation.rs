//! The checks a request passes against the loaded model before it takes a slot, and the options it then runs
//! with.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Result;
use augur::generation::config::GenerationOptions;
use augur::pipeline::{CallOptions, Prompt};
use augur::speculation::method::MethodName;
use augur::speculation::suffix_cache::SuffixCacheRef;
use augur::speculation::BackoffPolicy;

use crate::api;
use crate::api::{ApiError, CompletionRequest, Speculation};
use crate::auth::Owner;
use crate::state::Server;

impl Server {
    /// A request's `model`, when it names one, must be this server's (its id, path or the name it was loaded by).
    pub(crate) fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
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
    pub(crate) fn check_vocabulary(&self, ids: &[u32], param: impl Fn(usize) -> String) -> Result<(), ApiError> {
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

/// A validated request, ready to run.
pub(crate) struct Job {
    pub(crate) req: CompletionRequest,
    pub(crate) call: CallOptions,
    /// The prompt's tokens, by which an idle sequence with its longest cached prefix is chosen.
    pub(crate) prompt_ids: Vec<u32>,
    /// Who asks (the API key): a sequence's cached prompt is reused only by its own owner's requests.
    pub(crate) owner: String,
}

impl Job {
    /// Choice `index`'s options: with a seed, choice i draws from seed + i, so that choices differ and each
    /// is reproducible.
    pub(crate) fn call_for(&self, index: usize) -> CallOptions {
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
pub(crate) fn sampling_defaults(generation: &mut GenerationOptions, model: &GenerationOptions) {
    if generation.do_sample.is_none() {
        let t = generation.temperature.or(model.temperature).unwrap_or(1.0);
        generation.do_sample = Some(t > 0.0);
        generation.temperature = Some(t).filter(|&t| t > 0.0);
    }
    generation.top_k = generation.top_k.or(model.top_k).or(Some(0));
    generation.top_p = generation.top_p.or(model.top_p).or(Some(1.0));
}

/// Checks the model, the speculation and the token budget before the request takes a slot.
pub(crate) fn prepare(
    server: &Server,
    req: CompletionRequest,
    owner: Owner,
    cancel: Arc<AtomicBool>,
) -> Result<Job, ApiError> {
    server.check_model(req.model.as_deref())?;
    if req.n > server.engine.admission().slots() {
        return Err(ApiError::param(
            "n",
            format!(
                "`n` is {} but this server runs at most {} sequences at once",
                req.n,
                server.engine.admission().slots()
            ),
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
    let prompt_ids = match &req.prompt {
        Prompt::Text(t) => server.tokenizer.encode(t, true),
        Prompt::Chat(m) => server.tokenizer.encode_chat(m, true),
    }
    .map_err(|e| ApiError::bad(e.to_string()))?;
    let prompt_tokens = prompt_ids.len();
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
    let backoff = BackoffPolicy { running: server.engine.admission().running(), max_load: server.speculation_max_load };
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
        suffix_cache: Some(SuffixCacheRef { cache: Arc::clone(&server.suffix_cache), owner: owner.0.clone() }),
        cache_prompt: Some(req.cache_prompt),
    };
    Ok(Job { req, call, prompt_ids, owner: owner.0 })
}
