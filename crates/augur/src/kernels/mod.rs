//! Every unsafe block, target-feature gate and raw pointer of the crate lives here, under safe functions: CPU
//! features detected once ([`cpu`]), attention over a KV cache, the quantized products (one file per block
//! family), SiLU, the thread pool's shared output buffers, and the memory map of safetensors files. Each
//! kernel gives a row the same bits whatever the block it runs in, which keeps greedy speculation lossless.

pub mod activations;
pub mod attention;
pub mod cpu;
pub mod mmap;
pub mod parallel;
pub mod quant;
#[cfg(target_arch = "x86_64")]
pub mod simd;
