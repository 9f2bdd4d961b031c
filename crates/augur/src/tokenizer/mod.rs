//! Tokenizers: Hugging Face `tokenizer.json`, tokenizers rebuilt from GGUF metadata, chat templates and
//! streaming detokenization.
