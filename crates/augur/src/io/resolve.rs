//! Turns what the user passed as `--model` into local files: a GGUF file, a model directory, a file in augur's
//! model cache, a catalogue name (pulled into the cache on first use), a Hugging Face repo id found in the local
//! Hugging Face cache, or (with nothing passed) the catalogue's default model.

use crate::error::{Error, Result};
use crate::io::catalogue;
use crate::io::pull::{self, PlainProgress, Progress};
use std::path::{Path, PathBuf};

/// augur's model cache: `$AUGUR_MODELS_DIR`, else `$XDG_CACHE_HOME/augur/models`, else
/// `~/.cache/augur/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AUGUR_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| home().join(".cache"));
    cache.join("augur").join("models")
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."))
}

/// The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`.
pub fn hf_hub_cache() -> PathBuf {
    if let Some(d) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(d);
    }
    match std::env::var_os("HF_HOME") {
        Some(h) => PathBuf::from(h).join("hub"),
        None => home().join(".cache").join("huggingface").join("hub"),
    }
}

/// The snapshot directory of `repo_id` (`org/name`) in the hub cache: the revision `refs/main` names, else
/// the only snapshot present.
fn hf_snapshot(repo_id: &str) -> Option<PathBuf> {
    let repo = hf_hub_cache().join(format!("models--{}", repo_id.replace('/', "--")));
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs").join("main")) {
        let dir = snapshots.join(rev.trim());
        if dir.is_dir() {
            return Some(dir);
        }
    }
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(&snapshots).ok()?.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    if dirs.len() == 1 {
        dirs.pop()
    } else {
        None
    }
}

/// Resolves `--model`, pulling a missing catalogue model with progress as plain lines on stderr.
pub fn resolve_model(spec: Option<&str>) -> Result<PathBuf> {
    resolve_model_with(spec, &mut PlainProgress::default())
}

/// Resolves `--model`: a path, a file in augur's model cache, a catalogue name (pulled when missing, reporting
/// to `progress`), or a repo id in the Hugging Face cache; `None` means the default model.
pub fn resolve_model_with(spec: Option<&str>, progress: &mut dyn Progress) -> Result<PathBuf> {
    let spec = spec.unwrap_or(catalogue::DEFAULT_MODEL);
    let p = Path::new(spec);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    let in_cache = models_dir().join(spec);
    if in_cache.exists() {
        return Ok(in_cache);
    }
    if let Some(model) = catalogue::find(spec) {
        return pull::ensure(model, &models_dir(), false, progress);
    }
    if spec.split('/').count() == 2 && !spec.starts_with('.') && !spec.starts_with('/') {
        if let Some(dir) = hf_snapshot(spec) {
            return Ok(dir);
        }
    }
    Err(Error::ModelNotFound { name: spec.to_string(), catalogue: catalogue::names() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_model_is_a_clear_error() {
        let e = resolve_model(Some("no/such-model-anywhere")).unwrap_err();
        assert!(e.to_string().contains("no/such-model-anywhere"), "{e}");
    }
}
