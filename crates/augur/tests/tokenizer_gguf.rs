//! Tokenizers rebuilt from GGUF metadata must encode and decode exactly like the model's published
//! tokenizer.json (what Transformers uses).
//!
//! The files come from `augur pull tokenizer-qwen tokenizer-gemma3 qwen2.5-coder-0.5b gemma3-270m smollm2-135m` (as
//! `.ci/run` does), into `$AUGUR_MODELS_DIR` (default `$HOME/.cache/augur/models`). A missing file fails the test.

use std::path::{Path, PathBuf};

use augur::tokenizer::Tokenizer;
use candle_core::quantized::gguf_file;

/// Where the test models live: `$AUGUR_MODELS_DIR`, else `$HOME/.cache/augur/models`.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AUGUR_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/augur/models")
}

fn model_file(name: &str) -> PathBuf {
    let path = models_dir().join(name);
    assert!(
        path.is_file(),
        "missing test model file {}; pull it with `cargo run --release -p augur-cli -- pull {}` \
         (or set AUGUR_MODELS_DIR to the directory that holds it)",
        path.display(),
        augur::io::catalogue::find(name).map_or(name, |m| m.name),
    );
    path
}

fn gguf_tokenizer(path: &Path) -> Tokenizer {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let content = gguf_file::Content::read(&mut f).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    Tokenizer::from_gguf(&content, path).unwrap_or_else(|e| panic!("rebuild tokenizer from {}: {e}", path.display()))
}

fn reference(path: &Path) -> tokenizers::Tokenizer {
    tokenizers::Tokenizer::from_file(path).unwrap_or_else(|e| panic!("load {}: {e}", path.display()))
}

/// Text that exercises pre-tokenizers, normalizers and byte handling.
fn corpus() -> Vec<String> {
    let mut c: Vec<String> = [
        "",
        " ",
        "Hello, world!",
        "Hello world",
        " leading space",
        "trailing spaces   ",
        "multiple   spaces    between     words",
        "\ttabs\t\tand\nnewlines\n\n\nand\r\nCRLF\r\n",
        "   \n   \n\t\t \n",
        "It's I'll we've you're they'd I'M SHE'S DON'T",
        "Numbers: 0 7 42 123 1234 12345 3.14159 -42 1e10 0x1F 1,000,000 2024-07-23",
        "Unicode: naïve café façade Ünïcödé Ångström ß ſ ﬁ",
        "日本語のテキストです。中文文本，还有标点！한국어 텍스트",
        "Русский текст, ελληνικά, עברית, العربية, हिन्दी, ไทย",
        "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✓ → ∑ ∞",
        "Combining: e\u{301} a\u{308} n\u{303} (NFD) vs é ä ñ (NFC)",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "fn main() {\n\tlet v: Vec<u32> = (0..10).map(|x| x * x).collect();\n\tprintln!(\"{v:?}\");\n}\n",
        "<html><body><table><tr><td>cell</td></tr></table></body></html>",
        "{\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
        "    indented    code\n        deeper\n",
        "a\u{a0}non-breaking\u{2003}em-space\u{200b}zero-width",
        "\u{0}\u{1}\u{7f} control bytes",
        "▁already▁has▁metaspace Ġand Ċbytes",
        "A very long word: pneumonoultramicroscopicsilicovolcanoconiosis and URL https://example.com/a/b?c=d&e=f#g",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    c.push(include_str!("../src/tokenizer/stream.rs").to_string());
    c
}

/// Deterministic pseudo-random strings over a pool mixing scripts, digits, punctuation, whitespace
/// runs and special-token fragments, to catch pre-tokenizer and merge-order differences a fixed
/// corpus misses.
fn random_corpus(n: usize, seed: u64, specials: &[&str]) -> Vec<String> {
    let pool: Vec<&str> = vec![
        "a", "e", "the", " the", "The", "ing", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "'s", "'T", "'ll", "0",
        "1", "23", "456", "7890", ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "/", "\\", "\"", "#",
        "$", "%", "&", "*", "=", "+", "|", "~", "`", "é", "ñ", "ß", "Ω", "ж", "我", "们", "日本", "語", "한", "ا", "ह",
        "ก", "😀", "👍🏽", "🇫🇷", "\u{200d}", "\u{a0}", "\u{3000}", "▁", "Ġ", "<0x0A>", "fn", "def", "return", "://",
        "http", "\u{301}", "e\u{301}", "Å", "ﬁ", "\u{0}",
    ];
    let mut state = seed;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..n)
        .map(|_| {
            let len = (next() % 40) as usize;
            let mut s = String::new();
            for _ in 0..len {
                let r = next();
                if !specials.is_empty() && r % 23 == 0 {
                    s.push_str(specials[(r / 23) as usize % specials.len()]);
                } else {
                    s.push_str(pool[(r % pool.len() as u64) as usize]);
                }
            }
            s
        })
        .collect()
}

fn check_against_reference(tok: &Tokenizer, reference: &tokenizers::Tokenizer, texts: &[String]) {
    let mut failures = Vec::new();
    for text in texts {
        for add_special in [false, true] {
            let ours = tok.encode(text, add_special).unwrap();
            let theirs = reference.encode(text.as_str(), add_special).unwrap().get_ids().to_vec();
            if ours != theirs {
                failures.push(format!(
                    "encode({text:?}, add_special_tokens={add_special}):\n  gguf: {ours:?}\n  json: {theirs:?}"
                ));
                continue;
            }
            for skip in [false, true] {
                let ours_text = tok.decode(&ours, skip).unwrap();
                let theirs_text = reference.decode(&theirs, skip).unwrap();
                if ours_text != theirs_text {
                    failures.push(format!(
                        "decode({ours:?}, skip_special_tokens={skip}):\n  gguf: {ours_text:?}\n  json: {theirs_text:?}"
                    ));
                }
            }
            // Streaming gives decode's text.
            let mut s = tok.stream(false);
            let mut streamed = String::new();
            for &id in &ours {
                streamed += &s.push(id).unwrap();
            }
            streamed += &s.finish().unwrap();
            if streamed != tok.decode(&ours, false).unwrap() {
                failures.push(format!("stream of {text:?} gave {streamed:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn qwen25_gguf_matches_tokenizer_json() {
    let tok = gguf_tokenizer(&model_file("qwen2.5-coder-0.5b-instruct.gguf"));
    let reference = reference(&model_file("tokenizer-qwen3.json"));
    assert_eq!(tok.kind(), "byte-level BPE (pre-tokenizer `qwen2`)");
    assert_eq!(tok.bos_token_id(), Some(151643));
    assert!(!tok.add_bos_token());
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_ids(), &[151645]);
    assert_eq!(tok.pad_token_id(), Some(151643));
    assert!(tok.chat_template().is_some_and(|t| t.contains("<|im_start|>")));
    // The GGUF pads the vocabulary to the embedding size with [PAD…] tokens.
    assert_eq!(tok.vocab_size(), 151936);

    // Same ids for every token both know (Qwen3 adds <tool_response>… from 151665 on).
    for id in 0..151665u32 {
        let t = reference.id_to_token(id).unwrap();
        assert_eq!(tok.token_to_id(&t), Some(id), "token {t:?}");
    }
    for id in [151643u32, 151644, 151645] {
        assert!(tok.is_special(id));
    }
    assert!(!tok.is_special(151657), "<tool_call> is user-defined, not special");
    // Known difference: a GGUF only says "control", so the FIM/repo tokens become special here while
    // tokenizer.json has them as plain added tokens: decode(.., skip_special_tokens=true) drops them.
    let fim_prefix = 151659;
    assert!(tok.is_special(fim_prefix));
    assert_eq!(reference.decode(&[fim_prefix], true).unwrap(), "<|fim_prefix|>");
    assert_eq!(tok.decode(&[fim_prefix], true).unwrap(), "");

    let mut texts = corpus();
    texts.extend(
        [
            "<|im_start|>system\nYou are Qwen.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
            "<|endoftext|>x<|im_end|><|im_start|>",
            "text<tool_call>{\"name\": \"f\"}</tool_call>more",
            "<|im_start |> not special <|im_end",
        ]
        .map(String::from),
    );
    texts.extend(random_corpus(
        400,
        0x9E37_79B9_7F4A_7C15,
        &["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>"],
    ));
    check_against_reference(&tok, &reference, &texts);

    // The rendered chat template is tokenized without adding specials again.
    let msgs = [augur::tokenizer::ChatMessage::user("Write hello world in Rust.")];
    let text = tok.apply_chat_template(&msgs, true).unwrap();
    assert!(text.starts_with("<|im_start|>system\n"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    assert_eq!(tok.encode_chat(&msgs, true).unwrap(), reference.encode(text.as_str(), false).unwrap().get_ids());
}

#[test]
fn gemma3_gguf_matches_tokenizer_json() {
    let tok = gguf_tokenizer(&model_file("gemma-3-270m-q4_k_m.gguf"));
    let reference = reference(&model_file("tokenizer-gemma3.json"));
    assert_eq!(tok.kind(), "SentencePiece BPE (byte fallback)");
    assert_eq!(tok.bos_token(), Some("<bos>"));
    assert_eq!(tok.bos_token_id(), Some(2));
    assert!(tok.add_bos_token());
    assert_eq!(tok.eos_token_ids(), &[1]);
    assert_eq!(tok.pad_token_id(), Some(0));
    // tokenizer.json has one more added token (<image_soft_token>, 262144) than the GGUF.
    assert_eq!(tok.vocab_size(), 262144);
    for id in 0..262144u32 {
        let t = reference.id_to_token(id).unwrap();
        assert_eq!(tok.token_to_id(&t), Some(id), "token {t:?}");
    }
    for id in [0u32, 1, 2, 3, 105, 106] {
        assert!(tok.is_special(id), "{id}");
    }
    // Known differences in the special flag (encoding is unaffected): the GGUF marks <mask> and the
    // 6241 <unusedN> tokens as control (special), and <start_of_image>/<end_of_image> as
    // user-defined; tokenizer.json has it the other way round.
    assert!(tok.is_special(6) && tok.id_to_token(6).as_deref() == Some("<unused0>"));
    assert!(!tok.is_special(255999) && tok.id_to_token(255999).as_deref() == Some("<start_of_image>"));

    let mut texts = corpus();
    texts.extend(
        [
            "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
            "<bos>already has bos",
            "<b>bold</b> and <code>x</code> are user-defined tokens",
            "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n many newlines",
            "                                         forty spaces",
            "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t tabs",
        ]
        .map(String::from),
    );
    texts.extend(random_corpus(
        400,
        0xD1B5_4A32_D192_ED03,
        &["<start_of_turn>", "<end_of_turn>", "<bos>", "<b>", "<eos>"],
    ));
    check_against_reference(&tok, &reference, &texts);
}

#[test]
fn smollm2_gguf_tokenizer_round_trips() {
    let tok = gguf_tokenizer(&model_file("SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(tok.kind(), "byte-level BPE (pre-tokenizer `smollm`)");
    assert_eq!(tok.bos_token_id(), Some(1));
    assert_eq!(tok.eos_token_ids(), &[2]);
    assert!(!tok.add_bos_token());
    assert_eq!(tok.vocab_size(), 49152);
    let texts = corpus().into_iter().chain(random_corpus(300, 0x2545_F491_4F6C_DD1D, &["<|im_start|>", "<|im_end|>"]));
    for text in texts {
        let ids = tok.encode(&text, true).unwrap();
        assert!(tok.decode(&ids, false).unwrap() == text, "round trip of {text:?}");
        let mut s = tok.stream(false);
        let mut streamed = String::new();
        for &id in &ids {
            streamed += &s.push(id).unwrap();
        }
        streamed += &s.finish().unwrap();
        assert!(streamed == text, "stream of {text:?} gave {streamed:?}");
    }
    // Digits are split one by one and no space is prepended (SmolLM2's tokenizer.json:
    // Digits(individual) + ByteLevel(add_prefix_space=false)).
    let ids = tok.encode("12345", false).unwrap();
    assert_eq!(ids.len(), 5);
    let hello = tok.encode("Hello", false).unwrap();
    assert_eq!(tok.decode(&hello, false).unwrap(), "Hello");
    assert_eq!(tok.id_to_token(hello[0]).as_deref(), Some("Hello"));
    assert_eq!(tok.encode("<|im_start|>user", false).unwrap()[0], 1);
    let text = tok.apply_chat_template(&[augur::tokenizer::ChatMessage::user("Hi")], true).unwrap();
    assert!(text.starts_with("<|im_start|>system\n"), "{text}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
}
