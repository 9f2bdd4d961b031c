//! Files to named tensors: GGUF and safetensors, model resolution, the model catalogue and its downloads.

pub mod catalogue;
pub mod gguf;
pub mod pull;
pub mod resolve;
pub mod weights;
