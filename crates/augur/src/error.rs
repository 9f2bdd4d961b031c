//! The one error type of the library: every failure names what was wrong (file, tensor, field, token).

use std::path::PathBuf;

pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A model file that is not what it claims to be (bad magic, truncated, corrupt header).
    #[error("{path}: not a valid {format} file: {reason}")]
    BadFile { path: PathBuf, format: &'static str, reason: String },

    #[error("{path}: tensor `{name}` is missing")]
    MissingTensor { path: PathBuf, name: String },

    #[error("tensor `{name}` has shape {actual:?}, but the config implies {expected:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, actual: Vec<usize> },

    /// A config field (config.json, generation_config.json or GGUF metadata) that is missing or invalid.
    #[error("config field `{field}`: {reason}")]
    Config { field: String, reason: String },

    /// `supported` lists the architectures that load, comma-separated: the error carries the list it prints, so
    /// that this floor names nothing above it.
    #[error("unknown architecture `{name}` (supported: {supported})")]
    UnknownArchitecture { name: String, supported: String },

    /// Invalid or conflicting generation options, worded as Transformers words them where it has an error.
    #[error("{0}")]
    InvalidOption(String),

    #[error("the prompt has {prompt_tokens} tokens, which does not fit the model's context of {context} tokens")]
    PromptTooLong { prompt_tokens: usize, context: usize },

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// `catalogue` lists the catalogue's model names, comma-separated.
    #[error(
        "model `{name}` not found: not a file, a directory, a catalogue name ({catalogue}), nor a repo id in the \
         local Hugging Face cache"
    )]
    ModelNotFound { name: String, catalogue: String },

    /// A catalogue model that could not be pulled (registry unreachable, client missing, checksum mismatch).
    #[error("{0}")]
    Fetch(String),

    /// A model gave a NaN or infinite logit (broken weights, or an overflow): no token can be chosen honestly
    /// from that row. `model` names the model (its file, where the pipeline knows it), `position` the sequence
    /// position (prompt included) whose output row it is.
    #[error("{model} gave a non-finite logit ({value}) for token id {token} at position {position}")]
    NonFiniteLogits { model: String, position: usize, token: usize, value: f32 },

    /// A generation that ended abnormally outside the model (a worker thread that died).
    #[error("generation failed: {0}")]
    Generation(String),

    #[error("tensor computation: {0}")]
    Candle(#[from] candle_core::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config { field: field.into(), reason: reason.into() }
    }
}
