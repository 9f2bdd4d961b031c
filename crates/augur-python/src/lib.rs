//! `augur._native`: the engine's tokenizer and models for the Python package `augur`, whose Python half
//! (`python/augur/`) gives them Transformers' names, arguments and return types.
//!
//! Generation runs on a thread of its own with the GIL released; the calling thread waits for its token
//! blocks, hands them to the streamer and checks for signals in between, so Ctrl-C cancels a generation at its
//! next accepted token.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use augur::engine;
use augur::generation::config::GenerationOptions;
use augur::generation::output::TokenLogprob;
use augur::io::resolve::resolve_model;
use augur::models;
use augur::pipeline::{self, Assistant, CallOptions, LoadedGemma4Assistant, LoadedLm, Pipeline, Sinks};
use augur::speculation::suffix_cache::{SuffixCache, SuffixCacheRef, DEFAULT_SUFFIX_CACHE_TOKENS};
use augur::tokenizer::{ChatMessage, Tokenizer as EngineTokenizer};
use augur::Error;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// How often the waiting thread looks for a pending signal (Ctrl-C) while a generation runs.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// augur's errors as the Python exceptions Transformers raises for the same faults, with the same text:
/// files and models that cannot be read are `OSError`, bad options and inputs `ValueError`.
fn py_err(e: Error) -> PyErr {
    let text = e.to_string();
    match e {
        Error::Io { .. }
        | Error::BadFile { .. }
        | Error::MissingTensor { .. }
        | Error::ModelNotFound { .. }
        | Error::Fetch(_) => PyOSError::new_err(text),
        Error::InvalidOption(_)
        | Error::Config { .. }
        | Error::PromptTooLong { .. }
        | Error::Tokenizer(_)
        | Error::ChatTemplate(_)
        | Error::UnknownArchitecture { .. }
        | Error::ShapeMismatch { .. } => PyValueError::new_err(text),
        _ => PyRuntimeError::new_err(text),
    }
}

/// A tokenizer: a model's (GGUF metadata, a Hugging Face directory) or a bare `tokenizer.json`.
#[pyclass(frozen, module = "augur._native")]
struct Tokenizer {
    inner: Arc<EngineTokenizer>,
    path: PathBuf,
}

#[pymethods]
impl Tokenizer {
    /// Loads the tokenizer of `spec`: a GGUF file, a Hugging Face directory, a `tokenizer.json`, a catalogue
    /// name (pulled when missing) or a repo id in the local Hugging Face cache.
    #[staticmethod]
    fn load(py: Python<'_>, spec: &str) -> PyResult<Self> {
        py.detach(|| {
            let path = resolve_model(Some(spec))?;
            let inner = Arc::new(pipeline::load_tokenizer(&path)?);
            Ok(Tokenizer { inner, path })
        })
        .map_err(py_err)
    }

    fn encode(&self, py: Python<'_>, text: &str, add_special_tokens: bool) -> PyResult<Vec<u32>> {
        py.detach(|| self.inner.encode(text, add_special_tokens)).map_err(py_err)
    }

    fn decode(&self, py: Python<'_>, ids: Vec<u32>, skip_special_tokens: bool) -> PyResult<String> {
        py.detach(|| self.inner.decode(&ids, skip_special_tokens)).map_err(py_err)
    }

    /// Renders `messages` (`(role, content)` pairs) with the chat template.
    fn apply_chat_template(&self, messages: Vec<(String, String)>, add_generation_prompt: bool) -> PyResult<String> {
        let messages: Vec<ChatMessage> =
            messages.into_iter().map(|(role, content)| ChatMessage::new(role, content)).collect();
        self.inner.apply_chat_template(&messages, add_generation_prompt).map_err(py_err)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    fn is_special(&self, id: u32) -> bool {
        self.inner.is_special(id)
    }

    /// Whether both are the same tokenizer object (a model's own, or one loaded once and passed around).
    fn same_as(&self, other: &Tokenizer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    #[getter]
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    #[getter]
    fn bos_token(&self) -> Option<&str> {
        self.inner.bos_token()
    }

    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_token_id()
    }

    #[getter]
    fn eos_token(&self) -> Option<&str> {
        self.inner.eos_token()
    }

    #[getter]
    fn eos_token_ids(&self) -> Vec<u32> {
        self.inner.eos_token_ids().to_vec()
    }

    #[getter]
    fn pad_token(&self) -> Option<&str> {
        self.inner.pad_token()
    }

    #[getter]
    fn pad_token_id(&self) -> Option<u32> {
        self.inner.pad_token_id()
    }

    #[getter]
    fn unk_token(&self) -> Option<&str> {
        self.inner.unk_token()
    }

    #[getter]
    fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template()
    }
}

/// What a [`Model`] holds: a causal LM, or Gemma 4's assistant, which is read only once a target lends it
/// the tokenizer it works in.
enum Weights {
    Lm(LoadedLm),
    Gemma4Assistant { path: PathBuf, loaded: Option<Assistant> },
}

/// A loaded model. Its weights sit behind a lock that one generation holds at a time (as target or as
/// assistant); a generation takes them out for its pipeline and puts them back when it ends.
#[pyclass(frozen, module = "augur._native")]
struct Model {
    weights: Arc<Mutex<Option<Weights>>>,
    tokenizer: Option<Py<Tokenizer>>,
    path: PathBuf,
    config: models::ModelConfig,
    has_mtp: bool,
    /// The model's generation defaults (`generation_config.json`, or a GGUF's EOS id) as JSON.
    defaults: String,
    /// Earlier outputs of this model, which suffix decoding drafts from across `generate` calls (as vLLM's
    /// suffix method keeps one per engine); `suffix_global_cache=False` keeps a call out of it.
    suffix_cache: Arc<SuffixCache>,
}

fn lock(weights: &Mutex<Option<Weights>>) -> MutexGuard<'_, Option<Weights>> {
    weights.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks a generation's two models in the order of their addresses, whichever is the target: two generations
/// that use each other's model as assistant then take the locks in the same order and cannot each hold one
/// while waiting for the other.
fn lock_pair<'a>(
    target: &'a Mutex<Option<Weights>>,
    assistant: Option<&'a Mutex<Option<Weights>>>,
) -> (MutexGuard<'a, Option<Weights>>, Option<MutexGuard<'a, Option<Weights>>>) {
    match assistant {
        Some(a) if std::ptr::from_ref(a) < std::ptr::from_ref(target) => {
            let assistant = lock(a);
            (lock(target), Some(assistant))
        }
        _ => (lock(target), assistant.map(lock)),
    }
}

#[pymethods]
impl Model {
    /// Loads `spec`: a GGUF file, a Hugging Face directory, a catalogue name (pulled when missing) or a repo id
    /// in the local Hugging Face cache; `quantization` (`q8_0`, `q4_k`) quantizes a checkpoint's float weights as
    /// they load (lossy).
    #[staticmethod]
    #[pyo3(signature = (spec, quantization=None))]
    fn load(py: Python<'_>, spec: &str, quantization: Option<&str>) -> PyResult<Self> {
        let (weights, tokenizer, path, config, has_mtp, defaults) = py
            .detach(|| -> augur::Result<_> {
                let quantize = quantization.map(models::QuantizeOnLoad::parse).transpose()?;
                let path = resolve_model(Some(spec))?;
                if models::is_gemma4_assistant(&path)? {
                    LoadedGemma4Assistant::refuse_quantize(&path, quantize)?;
                    let config = models::ModelConfig::from_hf_file(&path.join("config.json"))?;
                    let tokenizer = LoadedGemma4Assistant::own_tokenizer(&path)?.map(Arc::new);
                    let weights = Weights::Gemma4Assistant { path: path.clone(), loaded: None };
                    return Ok((weights, tokenizer, path, config, false, "{}".to_string()));
                }
                let opts = models::LoadOptions { quantize, ..Default::default() };
                let lm = LoadedLm::load(&path, &opts)?;
                let defaults = serde_json::to_string(&lm.defaults).map_err(|e| Error::Generation(e.to_string()))?;
                let (tokenizer, config, has_mtp) = (Arc::clone(&lm.tokenizer), lm.config().clone(), lm.mtp.is_some());
                Ok((Weights::Lm(lm), Some(tokenizer), path, config, has_mtp, defaults))
            })
            .map_err(py_err)?;
        let tokenizer = tokenizer.map(|inner| Py::new(py, Tokenizer { inner, path: path.clone() })).transpose()?;
        Ok(Model {
            weights: Arc::new(Mutex::new(Some(weights))),
            tokenizer,
            path,
            config,
            has_mtp,
            defaults,
            suffix_cache: Arc::new(SuffixCache::new(DEFAULT_SUFFIX_CACHE_TOKENS)),
        })
    }

    /// Forwards of this model that ran in one batch with another sequence's (batched rows run so).
    #[getter]
    fn batched_forwards(&self) -> u64 {
        match &*lock(&self.weights) {
            Some(Weights::Lm(lm)) => lm.model.batched_forwards(),
            _ => 0,
        }
    }

    /// The model's own tokenizer (`None` for a Gemma 4 assistant stored without one).
    #[getter]
    fn tokenizer(&self, py: Python<'_>) -> Option<Py<Tokenizer>> {
        self.tokenizer.as_ref().map(|t| t.clone_ref(py))
    }

    #[getter]
    fn path(&self) -> String {
        self.path.display().to_string()
    }

    #[getter]
    fn defaults(&self) -> &str {
        &self.defaults
    }

    /// What Transformers' `model.config` is asked for most: the shape and the special ids.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = &self.config;
        let d = PyDict::new(py);
        d.set_item("model_type", c.architecture.name())?;
        d.set_item("vocab_size", c.vocab_size)?;
        d.set_item("hidden_size", c.hidden_size)?;
        d.set_item("intermediate_size", c.intermediate_size)?;
        d.set_item("num_hidden_layers", c.num_hidden_layers)?;
        d.set_item("num_attention_heads", c.num_attention_heads)?;
        d.set_item("num_key_value_heads", c.num_key_value_heads)?;
        d.set_item("head_dim", c.head_dim)?;
        d.set_item("max_position_embeddings", c.max_position_embeddings)?;
        d.set_item("tie_word_embeddings", c.tie_word_embeddings)?;
        d.set_item("bos_token_id", c.bos_token_id)?;
        d.set_item("eos_token_id", c.eos_token_ids.clone())?;
        d.set_item("num_nextn_predict_layers", c.num_mtp_layers)?;
        d.set_item("has_mtp_weights", self.has_mtp)?;
        Ok(d)
    }

    /// Generates from each row of prompt token ids (each row as its own sequence, see `Job::rows_through`) under
    /// `options` (a JSON object of generation options), drafting with `assistant` when given (its generation
    /// defaults overridden by `assistant_options` for this call), and returns per row `(new token ids, finish
    /// reason, stats as JSON)`. `on_tokens(ids)` receives each accepted block as it lands (one row only).
    #[pyo3(signature = (rows, options, assistant=None, assistant_options="{}", assistant_tokenizer=None, on_tokens=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        py: Python<'_>,
        rows: Vec<Vec<u32>>,
        options: &str,
        assistant: Option<&Model>,
        assistant_options: &str,
        assistant_tokenizer: Option<&Tokenizer>,
        on_tokens: Option<Py<PyAny>>,
    ) -> PyResult<Vec<(Vec<u32>, String, String)>> {
        let generation = options_from_json(options)?;
        let assistant_options = options_from_json(assistant_options)?;
        if on_tokens.is_some() && rows.len() != 1 {
            return Err(PyValueError::new_err("streaming needs exactly one row"));
        }
        if assistant.is_some_and(|a| Arc::ptr_eq(&a.weights, &self.weights)) {
            return Err(PyValueError::new_err("the assistant model must be another model than the one generating"));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            target: Arc::clone(&self.weights),
            assistant: assistant.map(|a| Arc::clone(&a.weights)),
            assistant_tokenizer: assistant_tokenizer.map(|t| Arc::clone(&t.inner)),
            assistant_options,
            rows,
            call: CallOptions {
                cancel: Some(Arc::clone(&cancel)),
                suffix_cache: Some(SuffixCacheRef { cache: Arc::clone(&self.suffix_cache), owner: String::new() }),
                ..CallOptions::new(generation)
            },
        };
        let (tx, mut rx) = mpsc::channel::<Vec<u32>>();
        let streaming = on_tokens.is_some();
        // The sender lives until the job ends, streaming or not: its end is what ends the wait below, which
        // checks for signals all along (without a streamer too).
        let worker = std::thread::spawn(move || {
            let result = job.run(streaming.then(|| tx.clone()));
            drop(tx);
            result
        });
        let stop = |py: Python<'_>, worker: std::thread::JoinHandle<_>, err: PyErr| {
            cancel.store(true, Ordering::Relaxed);
            let _ = py.detach(move || worker.join());
            Err(err)
        };
        loop {
            let (back, event) = py.detach(move || {
                let event = rx.recv_timeout(SIGNAL_POLL);
                (rx, event)
            });
            rx = back;
            match event {
                Ok(block) => {
                    if let Some(cb) = &on_tokens {
                        if let Err(e) = cb.call1(py, (block,)) {
                            return stop(py, worker, e);
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        return stop(py, worker, e);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        match py.detach(move || worker.join()) {
            Ok(result) => result.map_err(py_err),
            Err(_) => Err(PyRuntimeError::new_err("the generation thread panicked")),
        }
    }
}

/// One `generate` call, run on its own thread.
struct Job {
    target: Arc<Mutex<Option<Weights>>>,
    assistant: Option<Arc<Mutex<Option<Weights>>>>,
    assistant_tokenizer: Option<Arc<EngineTokenizer>>,
    /// Set on the assistant's generation defaults for this call (its `generation_config` as edited in Python).
    assistant_options: GenerationOptions,
    rows: Vec<Vec<u32>>,
    call: CallOptions,
}

impl Job {
    /// Locks the target and the assistant (see [`lock_pair`]), builds the pipeline from their weights, runs the rows and puts
    /// the weights back, also when a row fails or panics.
    fn run(self, stream: Option<mpsc::Sender<Vec<u32>>>) -> augur::Result<Vec<(Vec<u32>, String, String)>> {
        let (mut target_slot, mut assistant_slot) = lock_pair(&self.target, self.assistant.as_deref());
        let target = match target_slot.take() {
            Some(Weights::Lm(lm)) => lm,
            other => {
                let alone = other.is_some();
                *target_slot = other;
                return Err(if alone {
                    Error::InvalidOption(
                        "a Gemma 4 assistant drafts for a Gemma 4 target; it does not generate on its own".into(),
                    )
                } else {
                    lost()
                });
            }
        };
        let mut pipe = Pipeline { target, assistant: None, defaults: GenerationOptions::default() };
        let result = match assistant_slot.as_mut().map(|slot| take_assistant(slot, &pipe.target.tokenizer)) {
            Some(Err(e)) => Err(e),
            taken => {
                pipe.assistant = taken.and_then(Result::ok);
                self.with_assistant_options(&mut pipe, stream)
            }
        };
        let Pipeline { target, assistant, .. } = pipe;
        *target_slot = Some(Weights::Lm(target));
        if let (Some(slot), Some(a)) = (assistant_slot.as_mut(), assistant) {
            **slot = Some(match a {
                Assistant::Lm(lm) => Weights::Lm(lm),
                a => Weights::Gemma4Assistant { path: a.path().to_path_buf(), loaded: Some(a) },
            });
        }
        result
    }

    /// Runs the rows with the call's assistant defaults and tokenizer in place, then restores the assistant's
    /// own; a panic becomes an error so that the weights still go back.
    fn with_assistant_options(
        &self,
        pipe: &mut Pipeline,
        stream: Option<mpsc::Sender<Vec<u32>>>,
    ) -> augur::Result<Vec<(Vec<u32>, String, String)>> {
        let own_defaults = pipe.assistant.as_mut().map(|a| {
            let defaults = assistant_defaults(a);
            let own = defaults.clone();
            defaults.merge(&self.assistant_options);
            own
        });
        let own_tokenizer =
            self.assistant_tokenizer.as_ref().map(|t| pipe.replace_assistant_tokenizer(Arc::clone(t))).transpose();
        let result = own_tokenizer.and_then(|own| {
            let out = catch_unwind(AssertUnwindSafe(|| self.rows_through(pipe, stream)))
                .unwrap_or_else(|_| Err(Error::Generation("the generation panicked".into())));
            if let Some(own) = own {
                pipe.replace_assistant_tokenizer(own)?;
            }
            out
        });
        if let (Some(a), Some(own)) = (pipe.assistant.as_mut(), own_defaults) {
            *assistant_defaults(a) = own;
        }
        result
    }

    /// Runs the rows on `pipe` and forks of it, at once, so that their forwards run as batched forwards (each row
    /// gets the numbers it would get alone; see `engine::run_forked`).
    fn rows_through(
        &self,
        pipe: &mut Pipeline,
        stream: Option<mpsc::Sender<Vec<u32>>>,
    ) -> augur::Result<Vec<(Vec<u32>, String, String)>> {
        engine::run_forked(pipe, self.rows.len(), |i, p| self.row_through(p, &self.rows[i], stream.as_ref()))
            .into_iter()
            .collect()
    }

    /// One row's generation: its new tokens, finish reason and stats (JSON).
    fn row_through(
        &self,
        pipe: &mut Pipeline,
        row: &[u32],
        stream: Option<&mpsc::Sender<Vec<u32>>>,
    ) -> augur::Result<(Vec<u32>, String, String)> {
        if self.call.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(Error::Generation("cancelled".into()));
        }
        let output = match stream {
            Some(tx) => {
                let mut send = |block: &[u32], _: &[TokenLogprob]| {
                    let _ = tx.send(block.to_vec());
                };
                pipe.call_ids_with(row, &self.call, Sinks { text: None, tokens: Some(&mut send) })?
            }
            None => pipe.call_ids(row, &self.call, None)?,
        };
        let stats = serde_json::to_string(&output.stats).map_err(|e| Error::Generation(e.to_string()))?;
        Ok((output.tokens, output.finish_reason.as_str().to_string(), stats))
    }
}

/// The assistant out of its slot; Gemma 4's is read on first use, in the target's vocabulary.
fn take_assistant(slot: &mut Option<Weights>, target_tokenizer: &Arc<EngineTokenizer>) -> augur::Result<Assistant> {
    match slot.take() {
        None => Err(lost()),
        Some(Weights::Lm(lm)) => Ok(Assistant::Lm(lm)),
        Some(Weights::Gemma4Assistant { loaded: Some(a), .. }) => Ok(a),
        Some(Weights::Gemma4Assistant { path, loaded: None }) => {
            Assistant::load(&path, &Default::default(), target_tokenizer).inspect_err(|_| {
                *slot = Some(Weights::Gemma4Assistant { path: path.clone(), loaded: None });
            })
        }
    }
}

fn assistant_defaults(a: &mut Assistant) -> &mut GenerationOptions {
    match a {
        Assistant::Lm(lm) => &mut lm.defaults,
        Assistant::Gemma4(g) => &mut g.defaults,
    }
}

fn options_from_json(json: &str) -> PyResult<GenerationOptions> {
    match serde_json::from_str(json) {
        Ok(serde_json::Value::Object(map)) => GenerationOptions::from_json_map(&map).map_err(py_err),
        _ => Err(PyValueError::new_err("generation options must be a JSON object")),
    }
}

fn lost() -> Error {
    Error::Generation("this model's weights were lost when a generation panicked; load it again".into())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    augur::threads::quiet_candle_pool();
    m.add_class::<Tokenizer>()?;
    m.add_class::<Model>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
