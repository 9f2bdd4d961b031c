//! Loading Hugging Face tokenizer directories (tokenizer.json + tokenizer_config.json) with the
//! published Qwen and Gemma 3 tokenizer.json files.
//!
//! The files come from `augur pull tokenizer-qwen tokenizer-gemma3` (as `.ci/run` does), into augur's model cache
//! (`$AUGUR_MODELS_DIR`, default `$HOME/.cache/augur/models`). A missing file fails the test.

use std::path::{Path, PathBuf};

use augur::tokenizer::{ChatMessage, Tokenizer};

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
        "missing test file {}; pull it with `cargo run --release -p augur-cli -- pull {}` \
         (or set AUGUR_MODELS_DIR to the directory that holds it)",
        path.display(),
        augur::io::catalogue::find(name).map_or(name, |m| m.name),
    );
    path
}

/// A temporary model directory with `tokenizer.json` linked to `json` and the given config.
fn hf_dir(tag: &str, json: &Path, config: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("augur-tokenizer-hf-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("tokenizer.json");
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(json, &link).unwrap();
    #[cfg(not(unix))]
    std::fs::copy(json, &link).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    dir
}

#[test]
fn qwen_tokenizer_dir() {
    let json = model_file("tokenizer-qwen3.json");
    let dir = hf_dir(
        "qwen",
        &json,
        r#"{"bos_token": null, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "add_bos_token": false, "clean_up_tokenization_spaces": false,
            "chat_template": "{% for m in messages %}{{ '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}"#,
    );
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.kind(), "byte-level BPE");
    assert_eq!(tok.vocab_size(), 151669);
    assert_eq!(tok.bos_token_id(), None);
    assert!(!tok.add_bos_token());
    assert_eq!(tok.eos_token_ids(), &[151645]);
    assert_eq!(tok.pad_token_id(), Some(151643));
    let ids = tok.encode_chat(&[ChatMessage::user("Hello, 世界!")], true).unwrap();
    assert_eq!(ids[0], 151644);
    assert_eq!(tok.decode(&ids, false).unwrap(), "<|im_start|>user\nHello, 世界!<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nHello, 世界!\nassistant\n");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn gemma_tokenizer_dir_and_add_bos_token() {
    let json = model_file("tokenizer-gemma3.json");
    let config = r#"{"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
                     "add_bos_token": true, "add_eos_token": false}"#;
    let dir = hf_dir("gemma", &json, config);
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    assert_eq!(tok.kind(), "SentencePiece BPE (byte fallback)");
    assert_eq!(tok.vocab_size(), 262145);
    assert!(tok.add_bos_token());
    assert!(tok.chat_template().is_none());
    let err = tok.apply_chat_template(&[ChatMessage::user("hi")], true).unwrap_err();
    assert!(matches!(err, augur::Error::ChatTemplate(_)), "{err}");
    let ids = tok.encode("Hello  world", true).unwrap();
    assert_eq!(ids[0], 2);
    assert_eq!(tok.decode(&ids, true).unwrap(), "Hello  world");
    assert_eq!(tok.decode(&ids, false).unwrap(), "<bos>Hello  world");

    // add_bos_token = false in the config overrides tokenizer.json's template, as GemmaTokenizerFast does.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        config.replace(r#""add_bos_token": true"#, r#""add_bos_token": false"#),
    )
    .unwrap();
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    assert!(!tok.add_bos_token());
    assert_eq!(tok.encode("Hello", true).unwrap(), tok.encode("Hello", false).unwrap());
    std::fs::remove_dir_all(&dir).ok();
}
