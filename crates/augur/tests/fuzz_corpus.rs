//! Replays the fuzz targets' corpora through the same entry functions the targets call (`augur::fuzzing`), so the
//! normal `cargo test` checks every seed and every saved finding without nightly or libFuzzer: each input must
//! return (an error is fine) quickly, never panic, hang or abort. Seeds are real, valid files and must be accepted.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

type Entry = fn(&[u8]) -> augur::Result<()>;

const TARGETS: [(&str, Entry); 5] = [
    ("gguf_config", augur::fuzzing::gguf_config),
    ("gguf_tokenizer", augur::fuzzing::gguf_tokenizer),
    ("config_json", augur::fuzzing::config_json),
    ("safetensors", augur::fuzzing::safetensors),
    ("chat_template", augur::fuzzing::chat_template),
];

/// Far above what any input takes in a release build; a hang shows as a failure here, not a stuck test run.
const PER_INPUT: Duration = Duration::from_secs(20);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    out.sort();
    out
}

fn replay(target: &str, entry: Entry, dir: &str) -> Vec<(PathBuf, augur::Result<()>)> {
    files(&fuzz_dir().join(dir).join(target))
        .into_iter()
        .map(|f| {
            let data = std::fs::read(&f).unwrap();
            let start = Instant::now();
            let result = entry(&data);
            assert!(start.elapsed() < PER_INPUT, "{} took {:?}", f.display(), start.elapsed());
            (f, result)
        })
        .collect()
}

#[test]
fn seeds_are_accepted() {
    for (target, entry) in TARGETS {
        let results = replay(target, entry, "seeds");
        assert!(results.len() >= 3, "{target}: only {} seeds", results.len());
        for (f, r) in results {
            if let Err(e) = r {
                panic!("{target} seed {}: {e}", f.display());
            }
        }
    }
}

#[test]
fn regressions_return_errors() {
    let mut replayed = 0;
    for (target, entry) in TARGETS {
        for (f, r) in replay(target, entry, "regressions") {
            // Each saved finding is a hostile input: it must be refused with an error, not accepted or crash.
            assert!(r.is_err(), "{target} regression {} was accepted", f.display());
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no regression inputs under {}", fuzz_dir().join("regressions").display());
}
