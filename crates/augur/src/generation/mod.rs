//! Generation: options, logits processing, sampling, stopping, output and the plain decoding loop. Speculative
//! decoding builds on it in [`crate::speculation`].

pub mod config;
pub mod decode;
pub mod logits;
pub mod output;
pub mod sampler;
pub mod stopping;
