//! `augur serve` on loopback, driven with raw HTTP (and, in `openai_python_client`, by the official `openai`
//! Python package from PyPI): OpenAI's endpoints and error bodies, streaming, per-request speculation,
//! cancellation, the bounded queue, concurrent sequences, and greedy outputs identical to `augur generate`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    root().join("tests/fixtures").join(name).display().to_string()
}

/// SmolLM2-135M in augur's model cache (`.ci/run` fetches it); slow enough to cancel mid-stream.
fn smollm2() -> String {
    let dir = std::env::var("AUGUR_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/augur/models"));
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} is missing: run `cargo run --release -p augur-cli -- pull smollm2-135m`", p.display());
    p.display().to_string()
}

/// A running `augur serve`, killed on drop.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_augur"))
            .arg("serve")
            .args(["--port", "0", "--threads", "2"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("augur serve starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in `{line}`"))
            .to_string();
        // The port opens before the model loads; the second line says it is loaded.
        line.clear();
        out.read_line(&mut line).unwrap();
        assert!(line.contains("ready"), "augur serve did not get ready: `{line}`");
        Server { child, addr }
    }

    fn tiny(args: &[&str]) -> Server {
        let model = fixture("tiny-llama");
        let mut all = vec!["--model", model.as_str()];
        all.extend_from_slice(args);
        Server::start(&all)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The `data:` payloads of a server-sent-event body.
    fn events(&self) -> Vec<String> {
        self.body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

/// Decodes a `Transfer-Encoding: chunked` body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

fn send_raw(addr: &str, raw: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    // A server refusing a request early may close before reading all of it (a reset may follow its answer).
    let _ = s.write_all(raw);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = s.read(&mut chunk) {
        buf.extend_from_slice(&chunk[..n]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in `{text}`"));
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.to_string() };
    Reply { status, head: head.to_string(), body }
}

fn request_with(addr: &str, method: &str, path: &str, body: &str, headers: &str) -> Reply {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         {headers}Connection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

fn request(addr: &str, method: &str, path: &str, body: &str) -> Reply {
    request_with(addr, method, path, body, "")
}

fn post(addr: &str, path: &str, body: &Value) -> Reply {
    request(addr, "POST", path, &body.to_string())
}

/// Sends `body` (a streamed completion) on a connection of its own and reads up to its first event; the stream
/// goes on while the reader is kept.
fn open_stream(addr: &str, body: &Value) -> BufReader<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(s, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        let n = reader.read_line(&mut line).unwrap();
        assert!(n > 0, "the stream ended before its first event");
    }
    reader
}

fn augur_generate(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_augur")).arg("generate").args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_error(r: &Reply, status: u16, code: Option<&str>) {
    assert_eq!(r.status, status, "{}", r.body);
    let e = &r.json()["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", r.body);
    assert!(e["type"].is_string(), "{}", r.body);
    if let Some(c) = code {
        assert_eq!(e["code"], c, "{}", r.body);
    }
}

fn metric(addr: &str, name: &str) -> f64 {
    let m = request(addr, "GET", "/metrics", "").body;
    m.lines()
        .find_map(|l| l.strip_prefix(&format!("augur_{name} ")).map(|v| v.parse().unwrap()))
        .unwrap_or_else(|| panic!("no augur_{name} in\n{m}"))
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. The quick brown";

#[test]
fn endpoints_greedy_streaming_and_speculation() {
    let server = Server::tiny(&[]);
    let a = server.addr.as_str();

    let health = request(a, "GET", "/health", "");
    assert_eq!((health.status, health.json()["status"].clone()), (200, json!("ok")));
    let models = request(a, "GET", "/v1/models", "").json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny-llama");

    // Greedy over HTTP is `augur generate`, token for token (the text, and the count in `usage`).
    let expected = augur_generate(&["--model", &fixture("tiny-llama"), "--max-new-tokens", "24", PROMPT]);
    let body = json!({"model": "tiny-llama", "prompt": PROMPT, "max_tokens": 24, "temperature": 0});
    let r = post(a, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], expected["text"]);
    assert_eq!(v["usage"]["completion_tokens"], json!(expected["tokens"].as_array().unwrap().len()));
    // The server speculates by default (`auto`); greedy, the text is plain decoding's.
    assert_eq!(v["usage"]["speculation"]["method"], "auto");
    let text = expected["text"].as_str().unwrap().to_string();

    // `echo` returns the prompt first (Transformers' return_full_text).
    let echo = post(a, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "echo": true}));
    assert_eq!(echo.json()["choices"][0]["text"], format!("{PROMPT}{text}"));

    // Streamed: the chunks add up to the same text, then a finish reason, the usage, and [DONE].
    let s = post(
        a,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert_eq!(s.status, 200);
    assert!(s.head.contains("text/event-stream"), "{}", s.head);
    let events = s.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, text);
    assert!(chunks.len() > 3, "streamed in pieces, not at once");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], v["usage"]["completion_tokens"]);
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "length"));
    // With llama-server's `timings`: the prompt's forward, then the 23 tokens decoded after it, and their rate.
    let timings = &usage["timings"];
    assert_eq!(timings["predicted_n"], 23, "{timings}");
    let (ms, rate) = (timings["predicted_ms"].as_f64().unwrap(), timings["predicted_per_second"].as_f64().unwrap());
    assert!(ms > 0.0 && (rate - 23e3 / ms).abs() < 1e-6 * rate, "{timings}");
    assert_eq!(v["timings"]["predicted_n"], 23, "the whole response has them too");

    // Per-request speculation: prompt lookup proposes and keeps drafts on this repetitive prompt, with the
    // plain greedy text; "off" decodes plainly.
    let pl = post(
        a,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                "speculation": {"method": "prompt_lookup", "prompt_lookup_num_tokens": 4}}),
    )
    .json();
    assert_eq!(pl["choices"][0]["text"], text.as_str());
    let spec = &pl["usage"]["speculation"];
    assert_eq!(spec["method"], "prompt_lookup");
    assert!(spec["drafted_tokens"].as_u64().unwrap() > 0, "{spec}");
    assert!(spec["target_forwards"].as_u64().unwrap() <= 24);
    // Tree drafts through the same field, under vLLM's names: the same text, and trees that branched.
    // A prompt with several continuations of its last words, so that the trees branch.
    let branching = "A cat sat on a mat. A cat ran to a dog. A cat ate a fish. A cat";
    let tree_request = |speculation: Value| {
        post(
            a,
            "/v1/completions",
            &json!({"prompt": branching, "max_tokens": 24, "temperature": 0,
                                           "speculation": speculation}),
        )
        .json()
    };
    let plain_text = tree_request(json!("off"))["choices"][0]["text"].clone();
    let tree = tree_request(json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 4,
                                   "speculative_eagle_topk": 3, "speculative_num_draft_tokens": 8,
                                   "cost_aware_drafting": false}));
    assert_eq!(tree["choices"][0]["text"], plain_text);
    assert!(tree["usage"]["speculation"]["tree_rounds"].as_u64().unwrap() > 0, "{}", tree["usage"]);
    let too_wide = post(
        a,
        "/v1/completions",
        &json!({"prompt": "a", "speculation": {"method": "prompt_lookup", "speculative_eagle_topk": 99}}),
    );
    assert_error(&too_wide, 400, None);
    assert_eq!(too_wide.json()["error"]["param"], "speculation.speculative_eagle_topk");
    let off =
        post(a, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 8, "speculation": "off", "temperature": 0}));
    assert_eq!(off.json()["usage"]["speculation"]["method"], "plain");
    let no_assistant =
        post(a, "/v1/completions", &json!({"prompt": "a", "speculation": {"method": "assistant_model"}}));
    assert_error(&no_assistant, 400, None);

    // Chat: the template is applied as `augur generate --chat` applies it; streamed as deltas.
    let q = "Name three colors.";
    let expected = augur_generate(&["--model", &fixture("tiny-llama"), "--chat", "--max-new-tokens", "16", q]);
    let chat = json!({"model": "tiny-llama", "messages": [{"role": "user", "content": q}], "max_tokens": 16,
                      "temperature": 0});
    let c = post(a, "/v1/chat/completions", &chat).json();
    assert_eq!(c["object"], "chat.completion");
    assert_eq!(c["choices"][0]["message"]["role"], "assistant");
    assert_eq!(c["choices"][0]["message"]["content"], expected["text"]);
    let mut chat_stream = chat.clone();
    chat_stream["stream"] = json!(true);
    let cs = post(a, "/v1/chat/completions", &chat_stream);
    let events = cs.events();
    let chunks: Vec<Value> =
        events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, expected["text"].as_str().unwrap());

    // Stop strings end the text where they first appear, and are cut from it as OpenAI cuts them, in the whole
    // answer and in the stream; vLLM's `include_stop_str_in_output` keeps them.
    let cut = &text[..text.len() / 2].trim_end().to_string();
    let stop_at = cut.split_whitespace().last().unwrap_or(cut).to_string();
    let before = &text[..text.find(&stop_at).unwrap()];
    let stop_body = json!({"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": [stop_at]});
    let stopped = post(a, "/v1/completions", &stop_body).json();
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert_eq!(stopped["choices"][0]["text"], before, "the stop string {stop_at:?} is cut");
    let mut streamed_stop = stop_body.clone();
    streamed_stop["stream"] = json!(true);
    let events = post(a, "/v1/completions", &streamed_stop).events();
    let streamed: String = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, before, "the stream never shows the stop string");
    let mut kept = stop_body.clone();
    kept["include_stop_str_in_output"] = json!(true);
    let kept = post(a, "/v1/completions", &kept).json();
    let kept_text = kept["choices"][0]["text"].as_str().unwrap();
    assert!(kept_text.starts_with(before) && kept_text[before.len()..].starts_with(&stop_at), "{kept_text:?}");

    assert!(metric(a, "generation_tokens_total") >= 24.0 * 3.0);
    assert!(metric(a, "draft_tokens_total") > 0.0);
}

/// OpenAI's and vLLM's request fields do what they say: `n` choices (forked sequences, batched), log-probabilities
/// (the same with speculation), `logit_bias`, `stop_token_ids`, `top_k: -1`, `seed`; `/tokenize` and
/// `/detokenize`; `--ctx-size`, `--max-tokens-limit` and `--cors-origins`.
#[test]
fn openai_fields_are_honoured() {
    let server = Server::tiny(&["--ctx-size", "128", "--max-tokens-limit", "40", "--cors-origins", "http://app.test"]);
    let a = server.addr.as_str();
    let greedy = |extra: Value| {
        let mut b = json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let r = post(a, "/v1/completions", &b);
        assert_eq!(r.status, 200, "{b}: {}", r.body);
        r.json()
    };
    let plain = greedy(json!({"logprobs": 2}));
    let text = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let lp = &plain["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 16, "{lp}");
    assert!(tokens.iter().all(Value::is_string));
    for (i, (l, top)) in
        lp["token_logprobs"].as_array().unwrap().iter().zip(lp["top_logprobs"].as_array().unwrap()).enumerate()
    {
        let l = l.as_f64().unwrap();
        let best = top.as_object().unwrap().values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert!(l <= 0.0 && (l - best).abs() < 1e-6, "greedy takes the most likely token at {i}: {l} vs {best}");
    }
    // Speculation changes neither the text nor its log-probabilities.
    let spec = greedy(json!({"logprobs": 2, "speculation": {"method": "prompt_lookup", "prompt_lookup_num_tokens": 4,
                                                               "cost_aware_drafting": false}}));
    assert!(spec["usage"]["speculation"]["drafted_tokens"].as_u64().unwrap() > 0);
    assert_eq!(spec["choices"][0]["text"], text.as_str());
    for (x, y) in spec["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(lp["token_logprobs"].as_array().unwrap())
    {
        assert!((x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-4, "{x} vs {y}");
    }
    // Chats report `logprobs.content`, with `top_logprobs` alternatives.
    let chat = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "temperature": 0,
                "logprobs": true, "top_logprobs": 3}),
    )
    .json();
    let content = chat["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len() as u64, chat["usage"]["completion_tokens"].as_u64().unwrap());
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    assert!(content[0]["bytes"].is_array());
    // The tokens' own bytes (an EOS entry aside, whose text the answer skips) decode to the answer's text (which
    // shows a character cut by `max_tokens` as U+FFFD).
    let bytes: Vec<u8> = content
        .iter()
        .filter(|t| t["token"] != "<|endoftext|>")
        .flat_map(|t| t["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    assert_eq!(String::from_utf8_lossy(&bytes), chat["choices"][0]["message"]["content"].as_str().unwrap());

    // Streamed log-probabilities: each chunk carries the entries of the tokens accepted with it (several per
    // chunk under speculation); together they are the whole answer's, and the texts add up to its text.
    let stream = post(
        a,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 2, "stream": true,
                "speculation": {"method": "early_exit", "assistant_early_exit": 3, "num_assistant_tokens": 3,
                                "assistant_confidence_threshold": 0, "cost_aware_drafting": false}}),
    );
    assert_eq!(stream.status, 200, "{}", stream.body);
    let chunks: Vec<Value> =
        stream.events().iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    let (mut streamed_text, mut streamed_lps, mut offsets, mut widest) = (String::new(), vec![], vec![], 0);
    for c in &chunks {
        streamed_text.push_str(c["choices"][0]["text"].as_str().unwrap_or_default());
        if let Some(lp) = c["choices"][0]["logprobs"].as_object() {
            let n = lp["token_logprobs"].as_array().unwrap().len();
            widest = widest.max(n);
            streamed_lps.extend(lp["token_logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()));
            offsets.extend(lp["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()));
        }
    }
    assert_eq!(streamed_text, text);
    assert_eq!(streamed_lps.len(), 16);
    assert!(widest > 1, "a speculative round's tokens arrive in one chunk");
    for (x, y) in streamed_lps.iter().zip(lp["token_logprobs"].as_array().unwrap()) {
        assert!((x - y.as_f64().unwrap()).abs() < 1e-4, "{x} vs {y}");
    }
    let whole: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(offsets, whole, "offsets run on across chunks");

    // `n`: greedy choices all equal the single answer; seeded sampled choices are each reproducible.
    let two = greedy(json!({"n": 2}));
    assert_eq!(two["choices"].as_array().unwrap().len(), 2);
    assert!(two["choices"].as_array().unwrap().iter().all(|c| c["text"] == text.as_str()));
    assert_eq!(two["choices"][1]["index"], 1);
    assert_eq!(two["usage"]["completion_tokens"], 32);
    let sampled = |n: u64| greedy(json!({"n": n, "temperature": 1.0, "seed": 11, "top_k": -1}));
    let (s2, s1) = (sampled(2), sampled(1));
    assert_eq!(s2["choices"][0]["text"], s1["choices"][0]["text"], "choice 0 draws from the request's seed");
    assert_eq!(
        s2,
        {
            let mut again = sampled(2);
            again["id"] = s2["id"].clone();
            again["created"] = s2["created"].clone();
            again["usage"] = s2["usage"].clone();
            again["timings"] = s2["timings"].clone();
            again
        },
        "seeded choices repeat"
    );
    let streamed = post(
        a,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "n": 2, "stream": true}),
    );
    let mut per_choice = [String::new(), String::new()];
    for e in streamed.events().iter().filter(|e| *e != "[DONE]") {
        let c: Value = serde_json::from_str(e).unwrap();
        per_choice[c["choices"][0]["index"].as_u64().unwrap() as usize]
            .push_str(c["choices"][0]["text"].as_str().unwrap());
    }
    assert_eq!(per_choice[0], per_choice[1]);
    assert!(text.starts_with(&per_choice[0]) && !per_choice[0].is_empty());

    // `logit_bias` bans the greedy first token; `stop_token_ids` ends the text at a token of it.
    let ids = post(a, "/tokenize", &json!({"prompt": text, "add_special_tokens": false})).json();
    let ids: Vec<u64> = ids["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    let first = greedy(json!({"max_tokens": 1, "logprobs": 0}));
    let first_text = first["choices"][0]["logprobs"]["tokens"][0].as_str().unwrap().to_string();
    let first_id = post(a, "/tokenize", &json!({"prompt": first_text, "add_special_tokens": false})).json()["tokens"]
        [0]
    .as_u64()
    .unwrap();
    let banned = greedy(json!({"logit_bias": {first_id.to_string(): -100}}));
    assert!(!banned["choices"][0]["text"].as_str().unwrap().starts_with(&first_text), "{banned}");
    let stop_id = ids[3];
    let stopped = greedy(json!({"stop_token_ids": [stop_id]}));
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert!(stopped["usage"]["completion_tokens"].as_u64().unwrap() <= 4, "{stopped}");

    // /tokenize and /detokenize (vLLM's and llama.cpp's field names) round-trip.
    let t = post(a, "/tokenize", &json!({"content": "hello world"})).json();
    assert_eq!(
        (t["count"].clone(), t["max_model_len"].clone()),
        (json!(t["tokens"].as_array().unwrap().len()), json!(128))
    );
    let d = post(a, "/detokenize", &json!({"tokens": t["tokens"]})).json();
    assert_eq!((d["prompt"].as_str(), d["content"].as_str()), (Some("hello world"), Some("hello world")));
    let chat_ids = post(a, "/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]})).json();
    assert_eq!(chat_ids["count"], chat["usage"]["prompt_tokens"]);
    assert_error(&post(a, "/detokenize", &json!({"tokens": [99999999]})), 400, None);
    assert_error(&post(a, "/tokenize", &json!({"text": "x"})), 400, None);

    // --ctx-size caps prompt plus completion; --max-tokens-limit caps max_tokens.
    let r = post(a, "/v1/completions", &json!({"prompt": "word ".repeat(130), "max_tokens": 1}));
    assert_error(&r, 400, Some("context_length_exceeded"));
    let r = post(a, "/v1/completions", &json!({"prompt": "a", "max_tokens": 41}));
    assert_error(&r, 400, None);
    assert_eq!(r.json()["error"]["param"], "max_tokens");
    let unbounded =
        post(a, "/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true}))
            .json();
    assert_eq!(unbounded["usage"]["completion_tokens"], 40, "a chat without max_tokens gets the limit");

    // CORS: the listed origin is allowed, preflight included (no API key needed for it); others get no header.
    let pre = request_with(
        a,
        "OPTIONS",
        "/v1/completions",
        "",
        "Origin: http://app.test\r\nAccess-Control-Request-Method: POST\r\n",
    );
    assert!(pre.status < 300, "{}", pre.head);
    assert!(pre.head.to_ascii_lowercase().contains("access-control-allow-origin: http://app.test"), "{}", pre.head);
    let other = request_with(a, "GET", "/v1/models", "", "Origin: http://evil.test\r\n");
    assert!(!other.head.to_ascii_lowercase().contains("access-control-allow-origin"), "{}", other.head);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let server = Server::tiny(&["--max-body-bytes", "4096"]);
    let a = server.addr.as_str();
    assert_error(&request(a, "POST", "/v1/completions", "{\"prompt\": \"a\", "), 400, None);
    assert_error(&request(a, "POST", "/v1/completions", "[1, 2, 3]"), 400, None);
    assert_error(&request(a, "POST", "/v1/chat/completions", "{\"messages\": \"hi\"}"), 400, None);
    assert_error(&request(a, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": \"many\"}"), 400, None);
    assert_error(&post(a, "/v1/completions", &json!({"prompt": "a", "model": "gpt-5"})), 404, Some("model_not_found"));
    // The context is 512 tokens.
    let too_many = post(a, "/v1/completions", &json!({"prompt": "hello", "max_tokens": 100000}));
    assert_error(&too_many, 400, Some("context_length_exceeded"));
    let long_prompt = post(a, "/v1/completions", &json!({"prompt": "word ".repeat(600), "max_tokens": 1}));
    assert_error(&long_prompt, 400, Some("context_length_exceeded"));
    let oversized = post(a, "/v1/completions", &json!({"prompt": "x".repeat(10_000)}));
    assert_error(&oversized, 413, Some("request_too_large"));
    // A count that would wrap the token sum is refused, naming the field.
    let huge = post(a, "/v1/completions", &json!({"prompt": "hello", "max_tokens": u64::MAX}));
    assert_error(&huge, 400, Some("context_length_exceeded"));
    assert_eq!(huge.json()["error"]["param"], "max_tokens");
    let huge = post(
        a,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}],
                                                      "max_completion_tokens": u64::MAX}),
    );
    assert_eq!((huge.status, huge.json()["error"]["param"].clone()), (400, json!("max_tokens")), "{}", huge.body);
    assert_error(&post(a, "/v1/completions", &json!({"prompt": "a", "temperature": -1})), 400, None);
    // `n` choices are sequences of their own: more than the server runs at once cannot start together.
    let too_many_choices = post(a, "/v1/completions", &json!({"prompt": "a", "n": 5}));
    assert_error(&too_many_choices, 400, None);
    assert_eq!(too_many_choices.json()["error"]["param"], "n");
    for (body, param) in [
        (json!({"prompt": "a", "response_format": {"type": "json_object"}}), "response_format"),
        (json!({"prompt": "a", "presence_penalty": 1}), "presence_penalty"),
        (json!({"prompt": "a", "logit_bias": {"99999999": 3}}), "logit_bias"),
        (json!({"prompt": "a", "stop_token_ids": [99999999]}), "stop_token_ids[0]"),
        (json!({"prompt": "a", "unheard_of": true}), "unheard_of"),
    ] {
        let r = post(a, "/v1/completions", &body);
        assert_error(&r, 400, None);
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    assert_error(&post(a, "/v1/completions", &json!({"prompt": "a", "top_p": 7.0, "temperature": 1})), 400, None);
    assert_error(&request(a, "GET", "/v1/nothing", ""), 404, None);
    assert_error(&request(a, "GET", "/v1/completions", ""), 405, None);
    let garbage = send_raw(a, b"NOT HTTP AT ALL\r\n\r\n");
    assert_eq!(garbage.status, 400);
    // A body shorter than its Content-Length, then a hang-up: the server must shrug it off.
    {
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro").unwrap();
    }
    let ok = post(a, "/v1/completions", &json!({"prompt": "a", "max_tokens": 3}));
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert!(metric(a, "requests_total{status=\"400\"}") >= 10.0);
}

#[test]
fn concurrent_sequences_match_sequential_greedy_and_the_queue_is_bounded() {
    let server = Server::tiny(&["--parallel", "3", "--queue", "8"]);
    let a = server.addr.clone();
    let prompts = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "def main():", "Hello there"];
    let body = |p: &str, spec: bool| {
        let mut b = json!({"prompt": p, "max_tokens": 40, "temperature": 0});
        if spec {
            b["speculation"] = json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 3});
        }
        b
    };
    let sequential: Vec<String> = prompts
        .iter()
        .map(|p| {
            post(&a, "/v1/completions", &body(p, false)).json()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    // Ten requests at once (five prompts, plain and speculative): each sequence has its own cache and drafter.
    let handles: Vec<_> = (0..10)
        .map(|i| {
            let (a, b) = (a.clone(), body(prompts[i % 5], i >= 5));
            std::thread::spawn(move || post(&a, "/v1/completions", &b))
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.json()["choices"][0]["text"], sequential[i % 5].as_str(), "request {i}");
    }

    // One slot and no queue: a second request while the first streams gets 429.
    let busy = Server::tiny(&["--parallel", "1", "--queue", "0"]);
    let mut s = TcpStream::connect(&busy.addr).unwrap();
    let long = json!({"prompt": "The", "max_tokens": 400, "ignore_eos": true, "stream": true}).to_string();
    write!(s, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{long}", long.len())
        .unwrap();
    let mut first = [0u8; 64];
    s.read_exact(&mut first).unwrap();
    let second = post(&busy.addr, "/v1/completions", &json!({"prompt": "a", "max_tokens": 2}));
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("[DONE]"), "the first request completes: {rest}");
    assert_error(&second, 429, Some("queue_full"));
    let after = post(&busy.addr, "/v1/completions", &json!({"prompt": "a", "max_tokens": 2}));
    assert_eq!(after.status, 200, "{}", after.body);
}

#[test]
fn a_client_that_leaves_mid_stream_stops_its_generation() {
    let model = smollm2();
    let server = Server::start(&["--model", &model]);
    let a = server.addr.as_str();
    let reader = open_stream(
        a,
        &json!({"prompt": "Write a long story.", "max_tokens": 4000, "ignore_eos": true, "stream": true,
                "temperature": 0}),
    );
    drop(reader);
    assert_cancelled_early(a, Instant::now());
}

/// The server at `a` cancels its one generation of a 4000-token budget within a minute of `t0`, after fewer
/// tokens than asked, and holds no sequence afterwards.
fn assert_cancelled_early(a: &str, t0: Instant) {
    while metric(a, "cancelled_total") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the generation was not cancelled");
        std::thread::sleep(Duration::from_millis(100));
    }
    let generated = metric(a, "generation_tokens_total");
    assert!(generated < 4000.0, "stopped early, after {generated} tokens");
    assert_eq!(metric(a, "active_sequences"), 0.0);
}

/// llama.cpp's server test: a non-streamed request whose client leaves stops generating (the connection's close
/// drops the handler, which cancels the sequence), and frees its slot.
#[test]
fn a_non_streamed_request_cancelled_by_its_client_stops_generating() {
    let model = smollm2();
    let server = Server::start(&["--model", &model]);
    let a = server.addr.as_str();
    let body =
        json!({"prompt": "Write a long story.", "max_tokens": 4000, "ignore_eos": true, "temperature": 0}).to_string();
    let mut s = TcpStream::connect(a).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {a}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let t0 = Instant::now();
    while metric(a, "active_sequences") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the request never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    assert_cancelled_early(a, t0);
}

#[test]
fn the_api_key_guards_every_endpoint_but_health() {
    let key_file = root().join("target/serve-test-api-key");
    std::fs::write(&key_file, "s3cret-key\n").unwrap();
    let server = Server::tiny(&["--api-key-file", key_file.to_str().unwrap()]);
    let a = server.addr.as_str();
    assert_eq!(request(a, "GET", "/health", "").status, 200);
    assert_error(&request(a, "GET", "/v1/models", ""), 401, Some("invalid_api_key"));
    assert_error(&request(a, "GET", "/metrics", ""), 401, Some("invalid_api_key"));
    let body = json!({"prompt": "a", "max_tokens": 2}).to_string();
    assert_error(&request(a, "POST", "/v1/completions", &body), 401, Some("invalid_api_key"));
    for wrong in ["Bearer s3cret-kez", "Bearer s3cret-key-and-more", "Basic s3cret-key", "s3cret-key"] {
        let r = request_with(a, "GET", "/v1/models", "", &format!("Authorization: {wrong}\r\n"));
        assert_error(&r, 401, Some("invalid_api_key"));
    }
    let auth = "Authorization: Bearer s3cret-key\r\n";
    assert_eq!(request_with(a, "GET", "/v1/models", "", auth).status, 200);
    let r = request_with(a, "POST", "/v1/completions", &body, auth);
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn connections_beyond_the_cap_get_503_at_once() {
    let server = Server::tiny(&["--max-connections", "2"]);
    let a = server.addr.as_str();
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(a).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let r = request(a, "GET", "/v1/models", "");
    assert_error(&r, 503, Some("too_many_connections"));
    assert!(t0.elapsed() < Duration::from_secs(2), "answered fast");
    drop(idle);
    let t0 = Instant::now();
    loop {
        let r = request(a, "GET", "/v1/models", "");
        if r.status == 200 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "closed connections free their places: {}", r.body);
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sigterm(server: &Server) {
    let ok = Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap().success();
    assert!(ok, "kill -TERM failed");
}

/// Waits for the server to exit (up to `limit`) and returns whether it exited 0.
fn exits_cleanly(server: &mut Server, limit: Duration) -> bool {
    let t0 = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status.success();
        }
        assert!(t0.elapsed() < limit, "the server did not exit within {limit:?} of SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigterm_lets_streams_finish_then_exits_0() {
    let mut server = Server::tiny(&[]);
    let mut reader =
        open_stream(&server.addr, &json!({"prompt": "The", "max_tokens": 400, "ignore_eos": true, "stream": true}));
    sigterm(&server);
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("[DONE]"), "the stream in flight completes: {rest}");
    assert!(exits_cleanly(&mut server, Duration::from_secs(30)));
    assert!(TcpStream::connect(&server.addr).is_err(), "no longer listening");

    // Four streams in flight at SIGTERM: the two that fit in the deadline complete; the two longer ones end at
    // it with a final event (not `[DONE]`: they are not passed off as complete); the process still exits 0.
    let mut server = Server::start(&["--model", &smollm2(), "--shutdown-timeout", "1.5", "--parallel", "4"]);
    let streams: Vec<_> = [12, 12, 4000, 4000]
        .iter()
        .map(|&n| {
            let body = json!({"prompt": "Write a long story.", "max_tokens": n, "ignore_eos": true, "stream": true});
            (n, open_stream(&server.addr, &body))
        })
        .collect();
    let t0 = Instant::now();
    sigterm(&server);
    for (n, mut reader) in streams {
        let mut rest = Vec::new();
        let _ = reader.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        let last = rest.split("\n\n").filter(|e| e.contains("data: ")).last().unwrap_or_default().to_string();
        if n == 12 {
            assert!(last.contains("data: [DONE]"), "a short stream completes, not `{last}`");
        } else {
            assert!(
                last.contains("\"code\":\"server_shutdown\""),
                "a cut stream ends with a final event, not `{last}`"
            );
            assert!(!rest.contains("[DONE]"), "a cut stream is not passed off as complete");
        }
    }
    assert!(exits_cleanly(&mut server, Duration::from_secs(15)));
    assert!(t0.elapsed() >= Duration::from_millis(1400), "in-flight requests had their deadline");
}

/// 2,000 idle connections and 200 that send their head a byte at a time hold no thread a request needs: a real
/// request beside them is answered within 2 s; then the header deadline closes all of them.
#[test]
fn idle_and_slow_connections_do_not_starve_a_request() {
    let server = Server::tiny(&["--max-connections", "2400", "--header-timeout", "3"]);
    let a = server.addr.as_str();
    let idle: Vec<TcpStream> = (0..2000).map(|_| TcpStream::connect(a).unwrap()).collect();
    let mut slow: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = TcpStream::connect(a).unwrap();
            s.write_all(b"POST /v1/completions HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let trickle = std::thread::spawn(move || {
        // One header byte per connection every 100 ms, for 1 s.
        for _ in 0..10 {
            for s in &mut slow {
                let _ = s.write_all(b"X");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        slow
    });
    let t0 = Instant::now();
    let r = post(a, "/v1/completions", &json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0}));
    let took = t0.elapsed();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(took < Duration::from_secs(2), "a request beside 2,200 idle or slow connections took {took:?}");
    let slow = trickle.join().unwrap();
    // Past the header deadline the server has closed them: a read sees the end (or a reset), not a hang.
    std::thread::sleep(Duration::from_secs(3));
    for s in idle.iter().step_by(97).chain(slow.iter().step_by(17)) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 256];
        let closed = match (&*s).read(&mut buf) {
            Ok(n) => n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock && e.kind() != std::io::ErrorKind::TimedOut,
        };
        assert!(closed, "a connection that sent no whole head is still open after the header deadline");
    }
    assert_eq!(post(a, "/v1/completions", &json!({"prompt": "a", "max_tokens": 2})).status, 200);
}

/// 50 clients start streams (most of them queued) and leave; no slot stays taken: a request right after is
/// served at once and the gauges return to zero.
#[test]
fn clients_that_leave_mid_stream_leak_no_slot() {
    let server = Server::start(&["--model", &smollm2(), "--parallel", "4", "--queue", "64"]);
    let a = server.addr.as_str();
    let body =
        json!({"prompt": "Write a long story.", "max_tokens": 4000, "ignore_eos": true, "stream": true}).to_string();
    let clients: Vec<TcpStream> = (0..50)
        .map(|_| {
            let mut s = TcpStream::connect(a).unwrap();
            write!(s, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    assert!(metric(a, "active_sequences") >= 1.0, "the streams started");
    drop(clients);
    let t0 = Instant::now();
    let r = post(a, "/v1/completions", &json!({"prompt": "Hello", "max_tokens": 8, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(t0.elapsed() < Duration::from_secs(10), "served after {:?}", t0.elapsed());
    let t0 = Instant::now();
    while metric(a, "active_sequences") > 0.0 || metric(a, "queue_depth") > 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "slots still taken after the clients left");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(metric(a, "generation_tokens_total") < 4000.0, "the abandoned streams stopped early");
}

/// Malformed HTTP, each answered with its status, and the server keeps serving.
#[test]
fn malformed_http_is_answered_with_its_status() {
    let server = Server::tiny(&["--max-body-bytes", "65536", "--body-timeout", "1"]);
    let a = server.addr.as_str();
    let ok = r#"{"prompt": "a", "max_tokens": 2}"#;
    let status = |raw: &[u8]| send_raw(a, raw).status;
    // A body that stops arriving: 408 after the body deadline.
    let t0 = Instant::now();
    let stalled = status(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{\"pro");
    assert_eq!(stalled, 408, "a stalled body");
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(status(b"GARBAGE\r\n\r\n"), 400, "a bad request line");
    let version = status(b"GET /health HTTP/9.9\r\n\r\n");
    assert!(version == 505 || version == 400, "an unknown HTTP version: {version}");
    let dup = format!(
        "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{ok}",
        ok.len()
    );
    assert_eq!(status(dup.as_bytes()), 400, "two different Content-Lengths");
    let (x, y) = ok.split_at(10);
    let chunked = format!(
        "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{x}\r\n{:x}\r\n{y}\r\n0\r\n\r\n",
        x.len(),
        y.len()
    );
    let r = send_raw(a, chunked.as_bytes());
    assert_eq!(r.status, 200, "a chunked body is read: {}", r.body);
    // 10 MB: refused from its Content-Length before it is read; the client writes on another thread and the
    // answer is read meanwhile, as a client that reads while it sends would.
    let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(10 << 20));
    let mut conn = TcpStream::connect(a).unwrap();
    let mut writer = conn.try_clone().unwrap();
    let head = format!("POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", big.len());
    let sending = std::thread::spawn(move || {
        let _ = writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(big.as_bytes()));
    });
    let mut answer = [0u8; 512];
    let n = conn.read(&mut answer).unwrap();
    assert!(
        String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&answer[..n])
    );
    drop(conn);
    sending.join().unwrap();
    let body = b"{\"prompt\": \"\xff\xfe\xfd\"}";
    let mut invalid =
        format!("POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len())
            .into_bytes();
    invalid.extend_from_slice(body);
    assert_eq!(send_raw(a, &invalid).status, 400, "invalid UTF-8");
    assert_error(&request(a, "POST", "/v1/completions", "{\"prompt\": }"), 400, None);
    for huge in [
        r#"{"prompt": "a", "max_tokens": 1e400}"#,
        r#"{"prompt": "a", "max_tokens": 99999999999999999999999}"#,
        r#"{"prompt": "a", "seed": 1e30}"#,
        r#"{"prompt": "a", "temperature": 1e400}"#,
    ] {
        let r = request(a, "POST", "/v1/completions", huge);
        assert_error(&r, 400, None);
    }
    let old = send_raw(a, b"GET /health HTTP/1.0\r\n\r\n");
    assert_eq!(old.status, 200, "HTTP/1.0 is answered, and its connection closed (send_raw read to the end)");
    assert_eq!(request(a, "POST", "/v1/completions", ok).status, 200);
}

/// 8 clients × 20 requests, half of them speculative: every answer 200 (none 5xx, none refused), and each
/// prompt's greedy text the same with speculation as without.
#[test]
fn eight_clients_twenty_requests_each_get_no_5xx() {
    let server = Server::tiny(&["--parallel", "4", "--queue", "16"]);
    let a = server.addr.clone();
    let prompts = ["Once upon a time", "1, 2, 3, 4,", "def main():", PROMPT];
    let handles: Vec<_> = (0..8)
        .map(|c| {
            let a = a.clone();
            std::thread::spawn(move || {
                (0..20)
                    .map(|i| {
                        let p = prompts[(c + i) % prompts.len()];
                        let mut body = json!({"prompt": p, "max_tokens": 16, "temperature": 0});
                        if i % 2 == 1 {
                            body["speculation"] = json!({"method": "prompt_lookup", "prompt_lookup_num_tokens": 3});
                        }
                        let r = post(&a, "/v1/completions", &body);
                        assert_eq!(r.status, 200, "client {c}, request {i}: {}", r.body);
                        (p, r.json()["choices"][0]["text"].as_str().unwrap().to_string())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut texts = std::collections::HashMap::new();
    let mut answered = 0;
    for h in handles {
        for (p, text) in h.join().unwrap() {
            answered += 1;
            assert_eq!(texts.entry(p).or_insert_with(|| text.clone()), &text, "prompt {p:?}");
        }
    }
    assert_eq!(answered, 160);
    assert_eq!(metric(&a, "requests_total{status=\"200\"}"), 160.0, "every request answered 200, none 5xx");
}

/// The official `openai` Python client against the server: installed from PyPI into a virtual environment
/// under `target/` (network needed on the first run; a failure to install fails the test).
#[test]
fn openai_python_client() {
    let venv = root().join("target/openai-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap().success();
        assert!(ok, "python3 -m venv failed");
    }
    let has_openai = Command::new(&python).args(["-c", "import openai"]).status().unwrap().success();
    if !has_openai {
        let ok =
            Command::new(&python).args(["-m", "pip", "install", "--quiet", "openai>=1.40"]).status().unwrap().success();
        assert!(ok, "pip install openai failed (the test needs PyPI once; the venv is kept under target/)");
    }
    let tiny = Server::tiny(&["--api-key", "test-key"]);
    let smol = Server::start(&["--model", &smollm2()]);
    let expected = augur_generate(&["--model", &fixture("tiny-llama"), "--max-new-tokens", "20", PROMPT]);
    let expected_chat =
        augur_generate(&["--model", &fixture("tiny-llama"), "--chat", "--max-new-tokens", "12", "Name three colors."]);
    // The expected texts go through a file: a random tiny model's text may hold any character, NUL included.
    let expectations = root().join("target/openai-venv/expected.json");
    let texts = json!({"prompt": PROMPT, "text": expected["text"], "chat": expected_chat["text"]});
    std::fs::write(&expectations, texts.to_string()).unwrap();
    let out = Command::new(&python)
        .arg(root().join("crates/augur-cli/tests/openai_client.py"))
        .args([&tiny.addr, &smol.addr])
        .arg(&expectations)
        .output()
        .unwrap();
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{log}");
    assert!(log.contains("all openai client checks passed"), "{log}");
}

/// A port free now on loopback (bound and released; the test that takes it next is the only one asking).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Scale-out as the README shows it: nginx (Debian's package, installed by `.ci/run`) balancing two `augur serve`
/// replicas; one replica is killed while 40 requests run, and nginx retries its requests on the other, so every
/// request is answered 200.
#[test]
fn replicas_behind_nginx_survive_one_dying() {
    let nginx = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(nginx) = nginx else {
        panic!(
            "nginx is not installed: `.ci/run` installs it with `apt-get install nginx`; install it to run this test"
        );
    };
    let mut one = Server::tiny(&["--parallel", "2"]);
    let two = Server::tiny(&["--parallel", "2"]);
    let dir = root().join("target/nginx-test");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    let port = free_port();
    let root_user = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"));
    let conf = format!(
        "{user}worker_processes 1;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/logs/error.log;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n\
         fastcgi_temp_path {dir}/fastcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
         {upstream}\n  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://augur;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n\
         proxy_next_upstream error timeout http_502 http_503 non_idempotent;\n      proxy_next_upstream_tries 2;\n\
         proxy_connect_timeout 2s;\n    }}\n  }}\n}}\n",
        user = if root_user { "user root;\n" } else { "" },
        dir = dir.display(),
        upstream = include_str!("../../../tools/serve/nginx-upstream.conf")
            .replace("127.0.0.1:8081", &one.addr)
            .replace("127.0.0.1:8082", &two.addr),
    );
    let conf_path = dir.join("nginx.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let proxy =
        Nginx(Command::new(nginx).arg("-c").arg(&conf_path).arg("-p").arg(&dir).stderr(Stdio::null()).spawn().unwrap());
    let addr = format!("127.0.0.1:{port}");
    let t0 = Instant::now();
    while TcpStream::connect(&addr).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "nginx did not start: {}",
            std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (addr, answered) = (addr.clone(), std::sync::Arc::clone(&answered));
            std::thread::spawn(move || {
                for i in 0..10 {
                    let body = json!({"prompt": format!("{c} {i} Once upon a time"), "max_tokens": 48, "temperature": 0, "ignore_eos": true});
                    let r = post(&addr, "/v1/completions", &body);
                    assert_eq!(r.status, 200, "client {c}, request {i} through nginx: {}", r.body);
                    assert_eq!(r.json()["usage"]["completion_tokens"], 48);
                    answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    while answered.load(std::sync::atomic::Ordering::SeqCst) < 10 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the first requests were not answered");
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = one.child.kill();
    let _ = one.child.wait();
    let killed_at = answered.load(std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    drop(proxy);
    assert!(killed_at < 40, "the replica died while requests were still running");
    assert_eq!(answered.load(std::sync::atomic::Ordering::SeqCst), 40);
    assert!(metric(&two.addr, "generations_total") > (40 - killed_at) as f64 - 1.0, "the survivor served the rest");
    let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap_or_default();
    assert!(log.contains(&one.addr), "nginx met the dead replica and retried elsewhere; its log:\n{log}");
}

/// nginx, stopped on drop with SIGTERM (its master then stops its workers; SIGKILL would leave them running).
struct Nginx(Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}
