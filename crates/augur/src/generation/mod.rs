//! Generation: options, logits processing, sampling, stopping and the decoding loops.

pub mod config;
pub mod logits;
pub mod sampler;
pub mod stopping;
