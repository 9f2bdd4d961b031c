//! augur: assisted (speculative) decoding for large language models, with the semantics of
//! Hugging Face Transformers' `generate()`.
//!
//! Data flows one way: files → weights and config → model → logits → processors → verifier → tokens →
//! detokenizer → caller.
//!
//! The README follows; its Rust example is compiled as a doc test.
#![doc = include_str!("../../../README.md")]

pub mod config;
pub mod engine;
pub mod error;
pub mod fuzzing;
pub mod generation;
pub mod io;
pub mod kernels;
pub mod models;
pub mod nn;
pub mod pipeline;
pub mod speculation;
pub mod threads;
pub mod tokenizer;

pub use candle_core::{Device, Tensor};
pub use error::{Error, Result};
