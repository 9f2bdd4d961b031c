//! The server in-process, through its router: every endpoint, the key check, admission and streaming.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use augur::generation::config::GenerationOptions;
use augur::pipeline::Pipeline;
use augur::tokenizer::Tokenizer;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::Router;
use serde_json::json;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::auth::api_keys;
use crate::metrics::Metrics;
use crate::routes::router;
use crate::state::{load_server, App};
use crate::ServeConfig;

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

fn load(dir: &std::path::Path) -> Pipeline {
    let target = augur::pipeline::LoadedLm::load(dir, &Default::default()).unwrap();
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
    let mut bias: serde_json::Map<String, serde_json::Value> = (1..300).map(|i| (i.to_string(), json!(-100))).collect();
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
        Some(augur::pipeline::Assistant::load(&assistant, &Default::default(), &pipe.target.tokenizer).unwrap());
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
    let short = edited("tiny-llama-assistant", "short", "config.json", |c| c["max_position_embeddings"] = json!(300));
    let mut pipe = tiny();
    let assistant = augur::pipeline::Assistant::load(&short, &Default::default(), &pipe.target.tokenizer).unwrap();
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

/// Suffix decoding's cache of earlier answers is per API key: a key's repeated request drafts from its own
/// earlier answer (the usage says where each round's drafts came from), another key's never does; the text
/// is the same for all.
#[tokio::test]
async fn api_keys_never_share_the_suffix_cache() {
    let config = ServeConfig { api_key: Some("alpha, beta".into()), ..ServeConfig::default() };
    let router = serving(tiny(), &config);
    let body =
        json!({"prompt": "a b c", "max_tokens": 24, "temperature": 0, "speculation": {"method": "suffix"}}).to_string();
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

/// `cache_prompt` (on unless false, as in llama-server): a request that begins as the last one on an idle
/// sequence did reuses that sequence's cached prefix (`usage.prompt_tokens_details.cached_tokens`, OpenAI's
/// field) and gets the same text; `false` reuses nothing; a request of another API key never reuses it.
#[tokio::test]
async fn a_repeated_prompt_reuses_the_cache_of_its_own_key_only() {
    let config = ServeConfig { api_key: Some("alpha, beta".into()), ..ServeConfig::default() };
    let router = serving(tiny(), &config);
    let ask = |key, cache_prompt: Option<bool>| {
        let router = router.clone();
        let mut body = json!({"prompt": "a b c d e f g", "max_tokens": 16, "temperature": 0});
        if let Some(c) = cache_prompt {
            body["cache_prompt"] = json!(c);
        }
        async move {
            let (status, reply) = call_as(&router, Some(key), "POST", "/v1/completions", &body.to_string()).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached_tokens");
            let prompt = reply["usage"]["prompt_tokens"].as_u64().unwrap();
            // llama-server's `timings` say the same: the cached tokens, and the rest prefilled.
            let timings = &reply["timings"];
            assert_eq!(
                (timings["cache_n"].as_u64(), timings["prompt_n"].as_u64()),
                (Some(cached), Some(prompt - cached))
            );
            (reply["choices"][0]["text"].clone(), cached, prompt)
        }
    };
    let (text, first, prompt) = ask("alpha", None).await;
    let (again_text, again, _) = ask("alpha", None).await;
    let (other_text, other, _) = ask("beta", None).await;
    let (after_text, after, _) = ask("alpha", None).await;
    let (off_text, off, _) = ask("beta", Some(false)).await;
    assert_eq!(first, 0, "nothing cached before the first request");
    assert_eq!(again, prompt - 1, "the repeated prompt reuses all but its last token");
    assert_eq!((other, after), (0, 0), "a sequence's cache passed between keys");
    assert_eq!(off, 0, "cache_prompt false reused the cache");
    for t in [&again_text, &other_text, &after_text, &off_text] {
        assert_eq!(t, &text);
    }
}

/// A chat's next turn (the conversation so far, then a new message) prefills only what follows the last
/// answer's cached tokens.
#[tokio::test]
async fn a_chats_next_turn_reuses_the_conversation_so_far() {
    let router = serving(tiny(), &ServeConfig::default());
    let turn = |messages: serde_json::Value| {
        let router = router.clone();
        async move {
            let body = json!({"messages": messages, "max_tokens": 12, "temperature": 0}).to_string();
            let (status, reply) = call(&router, "POST", "/v1/chat/completions", &body).await;
            assert_eq!(status, StatusCode::OK, "{reply}");
            let usage = &reply["usage"];
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
            (reply["choices"][0]["message"]["content"].as_str().unwrap().to_string(), cached)
        }
    };
    let first = json!([{"role": "user", "content": "hello there"}]);
    let (answer, cached) = turn(first.clone()).await;
    assert_eq!(cached, 0);
    let mut next = first.as_array().unwrap().clone();
    next.push(json!({"role": "assistant", "content": answer}));
    next.push(json!({"role": "user", "content": "and then?"}));
    let (_, cached) = turn(json!(next)).await;
    assert!(cached > 3, "the second turn reused {cached} tokens of the first");
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
