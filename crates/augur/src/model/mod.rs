//! Causal language models built for speculation.

pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "gemma3"];
