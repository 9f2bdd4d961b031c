//! Every unsafe block, target-feature gate and raw pointer of the crate lives here, under safe functions: CPU
//! features detected once ([`cpu`]), attention over a KV cache (the cache itself in [`kv_cache`], a tree block's
//! shape in [`tree`], and with the logit rows of [`logits`] the device seam: docs/ARCHITECTURE.md), the quantized
//! products (one file per block family; the AMX tile products of 16 rows or more in `amx`), the dense products in a
//! checkpoint's own float type ([`dense`]), SiLU, the thread pool's shared output buffers, and the memory map of
//! safetensors files.
//!
//! These are written by hand, the engine's own core, for three reasons. Candle 0.11's quantized dot products are
//! scalar on x86 for Q4_1 and Q5_0, and its K-type ones pay for verification's extra rows almost in full. Its
//! products run on a barrier pool of its own whose threads spin beside the kernels' rayon threads, which stalls
//! forwards on a machine with few cores (BENCHMARKS.md). And where candle's kernels change their arithmetic with
//! the number of rows, each kernel here gives a row the same bits whatever the block it runs in, which keeps
//! greedy speculation lossless bit for bit.
//!
//! The public items are safe. The unsafe functions (intrinsics behind `#[target_feature]`, tiles that write
//! through raw pointers) are private to their files, or crate-private where another kernel file calls them
//! (`simd::fold16`, `SharedOut::slice`/`ptr`, `GroupTiles::run`); each states its precondition under
//! `# Safety`, and each unsafe block says under `SAFETY:` why it holds.

pub mod activations;
pub(crate) mod amx;
pub mod attention;
pub mod bandwidth;
pub mod cpu;
pub mod dense;
pub mod kv_cache;
pub mod logits;
pub mod mmap;
pub mod parallel;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod simd;
pub mod tree;
