//! What the CLI shows while it waits: a progress bar for a pull and a spinner for a slow model load on a
//! terminal, plain lines (pulls) or nothing (loads) when stderr is a file or a pipe.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use anyhow::Result;
use augur::io::catalogue::Model;
use augur::io::pull::{PlainProgress, Progress};
use augur::models::{LoadOptions, QuantizeOnLoad};
use augur::pipeline::{LoadedLm, Pipeline};
use indicatif::{ProgressBar, ProgressStyle};

/// A pull's progress as an indicatif bar: bytes, speed and time left, with the current step as its message.
#[derive(Default)]
struct BarProgress {
    bar: Option<ProgressBar>,
}

impl Progress for BarProgress {
    fn start(&mut self, model: &Model) {
        let bar = ProgressBar::new(model.size);
        let style = ProgressStyle::with_template(
            "{prefix} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} eta {eta} {wide_msg}",
        )
        .expect("a valid template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("pulling {}", model.name));
        bar.enable_steady_tick(Duration::from_millis(200));
        self.bar = Some(bar);
    }
    fn step(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(message.to_string()),
            None => eprintln!("augur: {message}"),
        }
    }
    fn position(&mut self, bytes: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bytes);
        }
    }
    fn finish(&mut self, model: &Model, message: &str) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        eprintln!("augur: {}: {message}", model.name);
    }
}

/// The progress reporter for pulls: a bar on a terminal, plain lines otherwise.
pub fn progress() -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() {
        Box::new(BarProgress::default())
    } else {
        Box::new(PlainProgress::default())
    }
}

/// `--model` as a local path, pulling a missing catalogue model with progress.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf> {
    Ok(augur::io::resolve::resolve_model_with(spec, progress().as_mut())?)
}

/// Runs `f`, showing a spinner labelled `what` on a terminal once it has taken more than a second.
pub fn while_loading<T>(what: &str, f: impl FnOnce() -> T) -> T {
    if !std::io::stderr().is_terminal() {
        return f();
    }
    let (done, wait) = mpsc::channel::<()>();
    let label = what.to_string();
    let spinner = std::thread::spawn(move || {
        if wait.recv_timeout(Duration::from_secs(1)) != Err(RecvTimeoutError::Timeout) {
            return;
        }
        let bar = ProgressBar::new_spinner();
        bar.set_message(label);
        bar.enable_steady_tick(Duration::from_millis(100));
        let _ = wait.recv();
        bar.finish_and_clear();
    });
    let out = f();
    drop(done);
    let _ = spinner.join();
    out
}

/// How the models load, beside `--model`.
#[derive(clap::Args, Clone, Default)]
pub struct LoadArgs {
    /// Quantize a Hugging Face checkpoint's float weights as they load, to q8_0 or q4_k (the assistant's too),
    /// for speed. LOSSY: the outputs are no longer the checkpoint's (nor Transformers'). A GGUF file refuses it.
    #[arg(long, value_name = "TYPE", value_parser = parse_quantize)]
    pub quantize: Option<QuantizeOnLoad>,
}

fn parse_quantize(name: &str) -> std::result::Result<QuantizeOnLoad, String> {
    QuantizeOnLoad::parse(name).map_err(|e| e.to_string())
}

impl LoadArgs {
    pub fn options(&self) -> LoadOptions {
        LoadOptions { quantize: self.quantize, ..Default::default() }
    }
}

/// A model loaded from `--model` (pulled first when it is a missing catalogue model), with a spinner while it
/// loads.
pub fn load_model(spec: Option<&str>, load: &LoadArgs) -> Result<(PathBuf, LoadedLm)> {
    let path = resolve(spec)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let opts = load.options();
    let lm = while_loading(&format!("loading {name}"), || LoadedLm::load_with(&path, &augur::Device::Cpu, &opts))?;
    Ok((path, lm))
}

/// The pipeline over `--model`.
pub fn load_pipeline(spec: Option<&str>, load: &LoadArgs) -> Result<Pipeline> {
    let (_, target) = load_model(spec, load)?;
    Ok(Pipeline { target, assistant: None, defaults: Default::default() })
}

/// What the summary line says of a lossy load, if the weights were quantized at load.
pub fn lossy_note(pipe: &Pipeline) -> String {
    match pipe.target.weights.quantized_on_load {
        Some(q) => format!(" [weights quantized to {} at load: lossy]", q.name()),
        None => String::new(),
    }
}
