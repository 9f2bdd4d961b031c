//! What users call: load a model (and an optional assistant) by path or id, give a prompt or chat messages and
//! options, get text, streamed or whole. The CLI and the server are thin shells over this.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;

use crate::error::{Error, Result};
use crate::generation::config::{GenerationConfig, GenerationOptions};
use crate::generation::decode;
use crate::generation::output::{Emitter, GenerationOutput, GenerationStats, TokenSink};
use crate::io::pull::{PlainProgress, Progress};
use crate::io::resolve::resolve_model_with;
use crate::models::mtp::MtpHead;
use crate::models::{self, CausalLm, ModelConfig, WeightsInfo};
use crate::speculation::factory::{self, AssistantParts, AssistantRef, DraftParts};
use crate::speculation::method::{self, Available, LoadedModel, MethodName};
use crate::speculation::methods::keep_default_head;
pub use crate::speculation::methods::LoadedGemma4Assistant;
use crate::speculation::suffix_cache::SuffixCacheRef;
use crate::speculation::{speculative, BackoffPolicy};
use crate::tokenizer::{ChatMessage, Tokenizer};

/// A prompt: raw text, or chat messages rendered with the model's chat template.
#[derive(Debug, Clone)]
pub enum Prompt {
    Text(String),
    Chat(Vec<ChatMessage>),
}

/// A model with its tokenizer and generation defaults.
pub struct LoadedLm {
    pub path: PathBuf,
    pub model: Box<dyn CausalLm>,
    /// Shared by the forks of this model.
    pub tokenizer: Arc<Tokenizer>,
    /// The model's `generation_config.json` (or, for GGUF, its EOS id), under the call's options.
    pub defaults: GenerationOptions,
    pub weights: WeightsInfo,
    /// The checkpoint's multi-token-prediction layers, which draft for `use_mtp`.
    pub mtp: Option<Box<dyn MtpHead>>,
    /// The tokens whose keys and values the last call left in `model`'s cache, which the next call with
    /// [`CallOptions::cache_prompt`] reuses as far as its prompt begins with them; valid only while the cache
    /// holds as many positions.
    held: Vec<u32>,
}

impl LoadedLm {
    /// Loads a GGUF file or a Hugging Face model directory, with its tokenizer, under `opts`.
    pub fn load(path: &Path, opts: &models::LoadOptions) -> Result<Self> {
        Self::load_sharing(path, opts, None)
    }

    /// Loads a model; a Hugging Face directory without a tokenizer takes `shared` (a Gemma 4 assistant, which
    /// works in its target's vocabulary).
    fn load_sharing(path: &Path, opts: &models::LoadOptions, shared: Option<&Arc<Tokenizer>>) -> Result<Self> {
        let (loaded, gguf_tokenizer) = models::load(path, &Device::Cpu, opts, |m| Tokenizer::from_gguf(m, path))?;
        let cfg = loaded.model.config().clone();
        let (tokenizer, mut defaults) = match gguf_tokenizer {
            Some(tokenizer) => (Arc::new(tokenizer), GenerationOptions::default()),
            None => {
                let gc = path.join("generation_config.json");
                let defaults =
                    if gc.exists() { GenerationOptions::from_json_file(&gc)? } else { GenerationOptions::default() };
                let tokenizer = match shared {
                    Some(t) if !path.join("tokenizer.json").exists() => t.clone(),
                    _ => Arc::new(Tokenizer::from_hf_dir(path)?),
                };
                (tokenizer, defaults)
            }
        };
        if defaults.eos_token_id.as_ref().is_none_or(|e| e.is_empty()) {
            let eos = if !cfg.eos_token_ids.is_empty() {
                cfg.eos_token_ids.clone()
            } else {
                tokenizer.eos_token_ids().to_vec()
            };
            if !eos.is_empty() {
                defaults.eos_token_id = Some(eos);
            }
        }
        let vocab = tokenizer.vocab_size();
        if vocab > cfg.vocab_size {
            return Err(Error::Tokenizer(format!(
                "{}: the tokenizer has {vocab} tokens but the model's embedding has only {} rows",
                path.display(),
                cfg.vocab_size
            )));
        }
        Ok(Self {
            path: path.to_path_buf(),
            model: loaded.model,
            tokenizer,
            defaults,
            weights: loaded.weights_info,
            mtp: loaded.mtp,
            held: Vec::new(),
        })
    }

    /// Another sequence over the same weights and tokenizer, with an empty cache. A model whose MTP layers are
    /// loaded is not forked: those layers keep one sequence's caches.
    pub fn fork(&self) -> Result<Self> {
        if self.mtp.is_some() {
            return Err(Error::InvalidOption(format!(
                "{}: a model with loaded MTP layers cannot be forked into concurrent sequences",
                self.path.display()
            )));
        }
        Ok(Self {
            path: self.path.clone(),
            model: self.model.fork()?,
            tokenizer: Arc::clone(&self.tokenizer),
            defaults: self.defaults.clone(),
            weights: self.weights.clone(),
            mtp: None,
            held: Vec::new(),
        })
    }

    /// How many of `ids`' first tokens this model's cache holds from the last call (see
    /// [`CallOptions::cache_prompt`]): at most all but the last, whose logits the next token needs.
    pub fn cached_prefix(&self, ids: &[u32]) -> usize {
        if self.model.cache_len() != self.held.len() {
            return 0;
        }
        let common = self.held.iter().zip(ids).take_while(|(a, b)| a == b).count();
        common.min(ids.len().saturating_sub(1))
    }

    /// Forgets which tokens the cache holds, so that no later call reuses them (a sequence passed to another
    /// API key's request).
    pub fn forget_cache(&mut self) {
        self.held.clear();
    }

    pub fn config(&self) -> &ModelConfig {
        self.model.config()
    }
}

/// The assistant model: a causal LM that drafts on its own (same tokenizer or not), or Gemma 4's assistant, which
/// drafts from the target's hidden states and KV cache.
pub enum Assistant {
    Lm(LoadedLm),
    Gemma4(LoadedGemma4Assistant),
}

impl Assistant {
    /// Loads the assistant at `path` under `opts` (a causal LM's; Gemma 4's assistant takes none); a Hugging
    /// Face directory without a tokenizer takes `shared` (the target's).
    pub fn load(path: &Path, opts: &models::LoadOptions, shared: &Arc<Tokenizer>) -> Result<Self> {
        Ok(match LoadedGemma4Assistant::load_if_at(path, opts, shared)? {
            Some(a) => Assistant::Gemma4(a),
            None => {
                let lm = LoadedLm::load_sharing(path, opts, Some(shared))?;
                keep_default_head(lm.model.as_ref(), &lm.tokenizer, shared)?;
                Assistant::Lm(lm)
            }
        })
    }

    pub fn path(&self) -> &Path {
        match self {
            Assistant::Lm(a) => &a.path,
            Assistant::Gemma4(a) => &a.path,
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match self {
            Assistant::Lm(a) => a.config(),
            Assistant::Gemma4(a) => a.model.config(),
        }
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        match self {
            Assistant::Lm(a) => &a.tokenizer,
            Assistant::Gemma4(a) => &a.tokenizer,
        }
    }

    fn tokenizer_mut(&mut self) -> &mut Arc<Tokenizer> {
        match self {
            Assistant::Lm(a) => &mut a.tokenizer,
            Assistant::Gemma4(a) => &mut a.tokenizer,
        }
    }

    pub fn defaults(&self) -> &GenerationOptions {
        match self {
            Assistant::Lm(a) => &a.defaults,
            Assistant::Gemma4(a) => &a.defaults,
        }
    }

    /// Another sequence of the assistant (Gemma 4's keeps no state of its own, so it is shared).
    pub fn fork(&self) -> Result<Self> {
        Ok(match self {
            Assistant::Lm(a) => Assistant::Lm(a.fork()?),
            Assistant::Gemma4(a) => Assistant::Gemma4(a.clone()),
        })
    }

    /// The causal LM, unless this is Gemma 4's assistant.
    pub fn lm_mut(&mut self) -> Option<&mut LoadedLm> {
        match self {
            Assistant::Lm(a) => Some(a),
            Assistant::Gemma4(_) => None,
        }
    }
}

/// A call's options: generation options plus what Transformers' text-generation pipeline takes besides them.
#[derive(Debug, Clone, Default)]
pub struct CallOptions {
    pub generation: GenerationOptions,
    /// Return the prompt text followed by the new text (text prompts only; a chat returns its new assistant
    /// message, the conversation being the messages plus that turn). `None`: Transformers' default, true.
    pub return_full_text: Option<bool>,
    /// Add the tokenizer's special tokens (BOS, say) to a text prompt. `None`: the tokenizer's default, true.
    /// Ignored for chats, whose template writes them (as in Transformers).
    pub add_special_tokens: Option<bool>,
    /// Generation ends, with finish reason `cancelled`, at the next accepted token once this is set.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Speculation pauses for this sequence under load or when drafts stop being accepted (the output is the
    /// same either way). `None`: it never pauses.
    pub backoff: Option<BackoffPolicy>,
    /// The speculation method, named; `None` picks it from the options and the loaded models by Transformers'
    /// precedence. [`MethodName::Plain`] decodes plainly whatever the options or a loaded assistant would choose.
    pub method: Option<MethodName>,
    /// Record each new token's log-probability with this many alternatives (see
    /// [`TokenLogprob`](crate::generation::output::TokenLogprob)); `None`: none recorded.
    pub logprobs: Option<usize>,
    /// Keep a stop string that ends the generation in the text (Transformers' behaviour, the default). `false`
    /// cuts it and what follows it, as OpenAI and vLLM (`include_stop_str_in_output`) do.
    pub include_stop_str_in_output: Option<bool>,
    /// Whether a stop string may begin in the prompt. `None`: true, Transformers' `StopStringCriteria`, which
    /// reads the whole sequence; `false` matches the generated text only, as OpenAI, vLLM and llama.cpp do.
    pub stop_strings_match_prompt: Option<bool>,
    /// The process-wide cache of earlier outputs that suffix decoding reads and feeds, with the caller's key;
    /// `None`: a suffix draft comes from the request's own prompt and output only.
    pub suffix_cache: Option<SuffixCacheRef>,
    /// Reuse the keys and values of the longest prefix of the prompt that the last call on this pipeline left
    /// in its cache (its prompt and output), as llama-server's `cache_prompt` does: only the rest is
    /// prefilled. Every row gets the same bits whatever the rows computed with it, so the output is the same.
    /// Drafters that read the target's states of the whole prompt (MTP, Gemma 4's assistant, early exit)
    /// prefill it all. `None`: false, as Transformers' `generate` without `past_key_values`.
    pub cache_prompt: Option<bool>,
}

impl CallOptions {
    pub fn new(generation: GenerationOptions) -> Self {
        Self { generation, ..Default::default() }
    }
}

/// Where a call's output goes as it lands.
#[derive(Default)]
pub struct Sinks<'s> {
    /// New text, as it is accepted.
    pub text: Option<&'s mut dyn FnMut(&str)>,
    /// Each accepted block's token ids, with their log-probabilities when asked for.
    pub tokens: Option<TokenSink<'s>>,
}

pub struct Pipeline {
    pub target: LoadedLm,
    pub assistant: Option<Assistant>,
    /// Options applied to every call unless the call sets them (the server's defaults, say).
    pub defaults: GenerationOptions,
}

/// What [`Pipeline::load`] loads: the target and, optionally, its assistant, each a GGUF file, a Hugging Face
/// model directory, a catalogue name (pulled when missing) or a repo id in the local Hugging Face cache.
#[derive(Debug, Clone, Default)]
pub struct LoadSpec {
    /// `None`: the default model.
    pub model: Option<String>,
    /// A model that drafts for the target: a causal LM (its tokenizer the target's or not) or Gemma 4's
    /// assistant.
    pub assistant: Option<String>,
    /// The assistant's tokenizer, for an assistant stored without one: a `tokenizer.json` file, a directory
    /// holding one, or a GGUF file.
    pub assistant_tokenizer: Option<PathBuf>,
    /// How the weights load, the assistant's too.
    pub options: models::LoadOptions,
}

impl Pipeline {
    /// Loads what `spec` names, pulling a missing catalogue model with progress as plain lines on stderr.
    pub fn load(spec: &LoadSpec) -> Result<Self> {
        Self::load_reporting(spec, &mut PlainProgress::default())
    }

    /// [`Self::load`], reporting pulls and loads to `progress`: the one way from names to a loaded pipeline.
    pub fn load_reporting(spec: &LoadSpec, progress: &mut dyn Progress) -> Result<Self> {
        let path = resolve_model_with(spec.model.as_deref(), progress)?;
        progress.loading(&file_name(&path));
        let target = LoadedLm::load(&path, &spec.options);
        progress.loaded();
        let mut pipe = Self { target: target?, assistant: None, defaults: GenerationOptions::default() };
        if let Some(name) = &spec.assistant {
            let path = resolve_model_with(Some(name), progress)?;
            progress.loading(&format!("the assistant {}", file_name(&path)));
            let assistant = Assistant::load(&path, &spec.options, &pipe.target.tokenizer);
            progress.loaded();
            pipe.assistant = Some(assistant?);
        }
        if let Some(path) = &spec.assistant_tokenizer {
            pipe.replace_assistant_tokenizer(Arc::new(load_tokenizer(path)?))?;
        }
        Ok(pipe)
    }

    /// Another pipeline over the same weights, with empty caches: one per concurrent sequence.
    pub fn fork(&self) -> Result<Self> {
        Ok(Self {
            target: self.target.fork()?,
            assistant: self.assistant.as_ref().map(Assistant::fork).transpose()?,
            defaults: self.defaults.clone(),
        })
    }

    /// The prompt's token ids as Transformers' pipeline would build them: a chat is rendered with the template
    /// and encoded without special tokens (the template writes them); raw text gets the tokenizer's special
    /// tokens when `add_special_tokens`.
    pub fn encode(&self, prompt: &Prompt, add_special_tokens: bool) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(t) => self.target.tokenizer.encode(t, add_special_tokens),
            Prompt::Chat(m) => self.target.tokenizer.encode_chat(m, true),
        }
    }

    /// The resolved configuration for a call: model defaults, then pipeline defaults, then the call's options.
    pub fn resolve_config(&self, options: &GenerationOptions) -> GenerationConfig {
        let mut o = self.target.defaults.clone();
        o.merge(&self.defaults);
        o.merge(options);
        GenerationConfig::from_options(&o)
    }

    /// The method a call runs under a caller that drafts by default (the CLI, the server): `named` when given;
    /// else `None`, Transformers' precedence, when `options` or a loaded assistant choose a method; else `auto`.
    pub fn default_method(&self, named: Option<MethodName>, options: &GenerationOptions) -> Option<MethodName> {
        if named.is_some() {
            return named;
        }
        let cfg = self.resolve_config(options);
        let available = self.available();
        let chosen = crate::speculation::registry::REGISTRY.iter().any(|m| (m.chosen)(&cfg, &available));
        (!chosen).then_some(MethodName::Auto)
    }

    /// What the pipeline has loaded, as method resolution reads it.
    fn available(&self) -> Available<'_> {
        let target = &self.target;
        Available {
            target: LoadedModel { path: &target.path, config: target.model.config(), tokenizer: &target.tokenizer },
            mtp: target.mtp.is_some(),
            assistant: self.assistant.as_ref().map(|a| LoadedModel {
                path: a.path(),
                config: a.config(),
                tokenizer: a.tokenizer(),
            }),
        }
    }

    /// Generates from `prompt`; the new text goes to `sink` as it is accepted and is returned in `text`.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        options: &GenerationOptions,
        sink: Option<&mut dyn FnMut(&str)>,
    ) -> Result<GenerationOutput> {
        let call = CallOptions { return_full_text: Some(false), ..CallOptions::new(options.clone()) };
        self.call(prompt, &call, sink)
    }

    /// Transformers' `pipeline("text-generation")(prompt, **options)`: with `return_full_text` (the default) a
    /// text prompt is returned, and streamed to `sink`, ahead of the new text.
    pub fn call(
        &mut self,
        prompt: &Prompt,
        options: &CallOptions,
        sink: Option<&mut dyn FnMut(&str)>,
    ) -> Result<GenerationOutput> {
        self.call_with(prompt, options, Sinks { text: sink, tokens: None })
    }

    /// [`Pipeline::call`] with both sinks (see [`Pipeline::call_ids_with`]).
    pub fn call_with(&mut self, prompt: &Prompt, options: &CallOptions, sinks: Sinks<'_>) -> Result<GenerationOutput> {
        let ids = self.encode(prompt, options.add_special_tokens.unwrap_or(true))?;
        self.call_encoded_with(prompt, &ids, options, sinks)
    }

    /// [`Pipeline::call_with`] on `prompt` already encoded to `ids` by [`Pipeline::encode`] under the same
    /// `add_special_tokens`: for a caller that needed the ids first (the server counts and checks them), so that
    /// the prompt is not tokenized twice.
    pub fn call_encoded_with(
        &mut self,
        prompt: &Prompt,
        ids: &[u32],
        options: &CallOptions,
        sinks: Sinks<'_>,
    ) -> Result<GenerationOutput> {
        let Sinks { text: mut sink, tokens } = sinks;
        let prefix = match prompt {
            Prompt::Text(t) if options.return_full_text.unwrap_or(true) => t.as_str(),
            _ => "",
        };
        if let Some(s) = sink.as_mut().filter(|_| !prefix.is_empty()) {
            s(prefix);
        }
        let mut out = self.run(ids, options, Sinks { text: sink, tokens })?;
        out.text.insert_str(0, prefix);
        Ok(out)
    }

    /// Generates from prompt token ids.
    pub fn generate_ids(
        &mut self,
        ids: &[u32],
        options: &GenerationOptions,
        sink: Option<&mut dyn FnMut(&str)>,
    ) -> Result<GenerationOutput> {
        self.run(ids, &CallOptions::new(options.clone()), Sinks { text: sink, tokens: None })
    }

    /// [`Pipeline::call`] on prompt token ids (the new text only).
    pub fn call_ids(
        &mut self,
        ids: &[u32],
        options: &CallOptions,
        sink: Option<&mut dyn FnMut(&str)>,
    ) -> Result<GenerationOutput> {
        self.run(ids, options, Sinks { text: sink, tokens: None })
    }

    /// [`Pipeline::call_ids`] with both sinks: text as it is accepted, and each accepted block's token ids with
    /// their log-probabilities (what Transformers' streamers and streamed `logprobs` receive).
    pub fn call_ids_with(&mut self, ids: &[u32], options: &CallOptions, sinks: Sinks<'_>) -> Result<GenerationOutput> {
        self.run(ids, options, sinks)
    }

    /// Uses `tokenizer` as the assistant's for universal assisted decoding (Transformers' `assistant_tokenizer`)
    /// and returns the one it replaces.
    pub fn replace_assistant_tokenizer(&mut self, tokenizer: Arc<Tokenizer>) -> Result<Arc<Tokenizer>> {
        let Some(a) = self.assistant.as_mut() else {
            return Err(Error::InvalidOption("an assistant tokenizer needs an assistant model".into()));
        };
        Ok(std::mem::replace(a.tokenizer_mut(), tokenizer))
    }

    fn run(&mut self, ids: &[u32], call: &CallOptions, sinks: Sinks<'_>) -> Result<GenerationOutput> {
        let Sinks { text: sink, tokens: token_sink } = sinks;
        // A named method reads only its own speculation fields (see `MethodName::scope`).
        let options = match call.method {
            Some(m) => m.scope(&call.generation)?,
            None => call.generation.clone(),
        };
        let cfg = self.resolve_config(&options);
        cfg.validate()?;
        let vocab = self.target.config().vocab_size;
        let outside: Vec<u32> =
            cfg.sequence_bias.iter().flat_map(|(seq, _)| seq).copied().filter(|&t| t as usize >= vocab).collect();
        if !outside.is_empty() {
            return Err(Error::InvalidOption(format!(
                "The model vocabulary size is {vocab}, but the following tokens were being biased: {outside:?}"
            )));
        }
        if ids.is_empty() {
            return Err(Error::InvalidOption("the prompt is empty (no tokens)".into()));
        }
        let context = self.target.config().max_position_embeddings;
        if ids.len() >= context {
            return Err(Error::PromptTooLong { prompt_tokens: ids.len(), context });
        }
        let max_new = cfg.max_new_tokens_for(ids.len(), Some(context))?.min(context - ids.len());
        let start = Instant::now();
        let mut stats = GenerationStats { prompt_tokens: ids.len(), ..Default::default() };
        let (target_path, assistant_path) =
            (self.target.path.clone(), self.assistant.as_ref().map(|a| a.path().to_path_buf()));
        let choice = method::choose(&cfg, call.method, &self.available())?;
        let target = &mut self.target;
        let reuse = if call.cache_prompt == Some(true) { target.cached_prefix(ids) } else { 0 };
        target.held.clear();
        let mut emitter =
            Emitter::new(&target.tokenizer, ids, max_new, cfg.eos_token_id.clone(), cfg.stop_strings.clone(), sink)
                .with_token_sink(token_sink)
                .with_cancel(call.cancel.clone())
                .with_logprobs(call.logprobs)
                .excluding_stop_strings(!call.include_stop_str_in_output.unwrap_or(true))
                .stop_strings_on_generated_only(!call.stop_strings_match_prompt.unwrap_or(true));
        let parts = DraftParts {
            target_tokenizer: &target.tokenizer,
            mtp: target.mtp.as_mut().map(|h| h.as_mut() as &mut dyn MtpHead),
            assistant: self.assistant.as_mut().filter(|_| choice.is_some_and(|(_, m)| m.uses_assistant())).map(|a| {
                let config = factory::assistant_config(&cfg, a.defaults(), &options, &self.defaults);
                match a {
                    Assistant::Lm(a) => AssistantParts {
                        config,
                        model: AssistantRef::Lm(a.model.as_mut()),
                        tokenizer: &a.tokenizer,
                        defaults: &a.defaults,
                    },
                    Assistant::Gemma4(a) => a.parts(config),
                }
            }),
            suffix_cache: call.suffix_cache.clone(),
        };
        let mut drafter = factory::build(choice, &cfg, ids.len(), target.model.config(), parts, call.backoff.as_ref())?;
        let reuse = if drafter.as_ref().is_some_and(|d| d.reads_target().prefill) { 0 } else { reuse };
        target.model.truncate(reuse);
        stats.cached_prompt_tokens = reuse;
        let result = match drafter.as_deref_mut() {
            Some(d) => speculative::generate(target.model.as_mut(), d, &cfg, &mut emitter, &mut stats),
            None => decode::generate(target.model.as_mut(), &cfg, &mut emitter, &mut stats),
        };
        result.map_err(|e| match e {
            // Name the file: "the assistant model" alone does not say which one.
            Error::NonFiniteLogits { model, position, token, value } => {
                let file = match &assistant_path {
                    Some(a) if model.starts_with(decode::ASSISTANT) => a,
                    _ => &target_path,
                };
                Error::NonFiniteLogits { model: format!("{model} ({})", file.display()), position, token, value }
            }
            e => e,
        })?;
        // A block cut by EOS, the budget or a stop string leaves positions past the output in the cache.
        let held = target.model.cache_len().min(emitter.tokens().len());
        target.model.truncate(held);
        target.held = emitter.tokens()[..held].to_vec();
        stats.seconds = start.elapsed().as_secs_f64();
        stats.finish();
        Ok(emitter.into_output(stats))
    }
}

/// A tokenizer given on its own: a Hugging Face tokenizer directory, a GGUF file's (read from its metadata,
/// no tensor loaded), or a bare `tokenizer.json` (then without the special-token settings of a
/// `tokenizer_config.json`).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    if path.is_dir() {
        return Tokenizer::from_hf_dir(path);
    }
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut magic = [0u8; 4];
    let is_gguf = file.read_exact(&mut magic).is_ok() && &magic == b"GGUF";
    if is_gguf {
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        file.seek(SeekFrom::Start(0)).map_err(|e| Error::io(path, e))?;
        let content = crate::io::gguf::read(&mut BufReader::new(file), len, path)?;
        return Tokenizer::from_gguf(&content, path);
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let inner = serde_json::from_slice::<crate::tokenizer::Inner>(&bytes).map_err(|e| Error::BadFile {
        path: path.to_path_buf(),
        format: "tokenizer.json",
        reason: e.to_string(),
    })?;
    Tokenizer::from_parts(inner, &serde_json::Value::Null, &serde_json::Value::Null, None, path)
}

/// A path's last component, as a progress line names a model.
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned())
}
