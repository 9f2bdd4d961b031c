//! What the CLI shows while it waits: a progress bar for a pull and a spinner for a model load on a terminal,
//! plain lines (pulls) or nothing (loads) when stderr is a file or a pipe.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Result;
use augur::io::catalogue::Model;
use augur::io::pull::{PlainProgress, Progress};
use augur::models::{LoadOptions, QuantizeOnLoad};
use augur::pipeline::{LoadSpec, Pipeline};
use indicatif::{ProgressBar, ProgressStyle};

/// A pull's progress as an indicatif bar: bytes, speed and time left, with the current step as its message.
#[derive(Default)]
struct BarProgress {
    bar: Option<ProgressBar>,
    spinner: Option<ProgressBar>,
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
    fn loading(&mut self, what: &str) {
        let spinner = ProgressBar::new_spinner();
        spinner.set_message(format!("loading {what}"));
        spinner.enable_steady_tick(Duration::from_millis(100));
        self.spinner = Some(spinner);
    }
    fn loaded(&mut self) {
        if let Some(spinner) = self.spinner.take() {
            spinner.finish_and_clear();
        }
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
    /// `model` (`--model`) loaded under these flags, with no assistant.
    pub fn spec(&self, model: Option<&str>) -> LoadSpec {
        let options = LoadOptions { quantize: self.quantize, ..Default::default() };
        LoadSpec { model: model.map(str::to_string), options, ..Default::default() }
    }
}

/// The pipeline over `spec`, as `--model` and the speculation flags name it: a missing catalogue model is pulled
/// with a progress bar, and a spinner turns while a model loads (on a terminal).
pub fn load_pipeline(spec: &LoadSpec) -> Result<Pipeline> {
    Ok(Pipeline::load_reporting(spec, progress().as_mut())?)
}

/// What the summary line says of a lossy load, if the weights were quantized at load.
pub fn lossy_note(pipe: &Pipeline) -> String {
    match pipe.target.weights.quantized_on_load {
        Some(q) => format!(" [weights quantized to {} at load: lossy]", q.name()),
        None => String::new(),
    }
}
