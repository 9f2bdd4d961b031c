//! A generation on a thread of its own, its text read as an iterator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::error::{Error, Result};
use crate::generation::output::GenerationOutput;
use crate::pipeline::{CallOptions, Pipeline, Prompt};

impl Pipeline {
    /// Runs [`Pipeline::call`] on a fork of this pipeline in a thread of its own and returns its text chunks as
    /// an iterator; dropping the iterator cancels the generation.
    pub fn stream(&self, prompt: Prompt, options: CallOptions) -> Result<TextChunks> {
        let mut pipe = self.fork()?;
        let cancel = options.cancel.clone().unwrap_or_default();
        let options = CallOptions { cancel: Some(Arc::clone(&cancel)), ..options };
        let (tx, rx) = mpsc::channel();
        let flag = Arc::clone(&cancel);
        let handle = std::thread::spawn(move || {
            let mut send = |chunk: &str| {
                if tx.send(chunk.to_string()).is_err() {
                    flag.store(true, Ordering::Relaxed);
                }
            };
            pipe.call(&prompt, &options, Some(&mut send))
        });
        Ok(TextChunks { chunks: rx, handle: Some(handle), cancel })
    }
}

/// The text of a streamed generation, chunk by chunk, as it is accepted (see [`Pipeline::stream`]).
pub struct TextChunks {
    chunks: mpsc::Receiver<String>,
    handle: Option<JoinHandle<Result<GenerationOutput>>>,
    cancel: Arc<AtomicBool>,
}

impl Iterator for TextChunks {
    type Item = String;

    fn next(&mut self) -> Option<String> {
        self.chunks.recv().ok()
    }
}

impl TextChunks {
    /// Stops the generation at its next accepted token.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    /// Waits for the end and returns the whole output (its text is every chunk, in order), or the error that
    /// ended the generation early.
    pub fn finish(mut self) -> Result<GenerationOutput> {
        while self.chunks.recv().is_ok() {}
        match self.handle.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            _ => Err(Error::Generation("the generation thread panicked".into())),
        }
    }
}

impl Drop for TextChunks {
    fn drop(&mut self) {
        if self.handle.is_some() {
            self.cancel();
        }
    }
}
