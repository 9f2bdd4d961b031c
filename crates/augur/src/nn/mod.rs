//! Layers: weights plus calls into [`crate::kernels`]. Each holds weights only; a sequence's state (its
//! [`KvCache`]) is passed in, so that sequences share one loaded model.

pub mod attention;
pub mod embedding;
pub mod linear;
mod load;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod rope;

use candle_core::Tensor;

pub use attention::{per_sequence, Attention, Step};
pub use embedding::{Embedding, StoredTable};
pub use linear::{Linear, LinearPath};
pub use mlp::Mlp;
pub use norm::RmsNorm;
pub use rope::{Rope, Ropes};

// A sequence's cache and a tree block's shape live with the attention kernel that reads them; layers pass them.
pub use crate::kernels::kv_cache::KvCache;
pub use crate::kernels::tree::TreeMask;

use crate::error::Result;

/// A tensor's values in row-major order, as f32.
pub(crate) fn flat(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}
