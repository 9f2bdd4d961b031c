//! Generation: options, the speculation method they choose, logits processing, sampling, stopping, and the
//! decoding loops (plain and speculative) with their drafters.

pub mod config;
pub mod cost_model;
pub mod decode;
pub mod draft_length;
pub mod drafters;
pub mod logits;
pub mod method;
pub mod output;
pub mod sampler;
pub mod speculative;
pub mod stopping;
pub mod verify;
