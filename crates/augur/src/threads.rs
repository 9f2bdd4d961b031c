//! The CPU kernels' thread count, set once per process before a model loads.

use crate::error::{Error, Result};

/// Sizes rayon's global pool, which candle's and augur's CPU kernels run on; `None` keeps rayon's default (every
/// core). `RAYON_NUM_THREADS` is set as well: candle reads it to decide how many ways to split a matrix product.
/// Call it before anything runs on the pool: the pool is built once.
pub fn set_threads(threads: Option<usize>) -> Result<()> {
    quiet_candle_pool();
    if let Some(n) = threads {
        if n == 0 {
            return Err(Error::InvalidOption("the thread count must be at least 1".into()));
        }
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .map_err(|e| Error::InvalidOption(format!("cannot size the thread pool: {e}")))?;
    }
    Ok(())
}

/// Candle's quantized products (the GGUF types without a kernel of ours on this CPU) run on a barrier pool of
/// its own, whose threads spin 25,000 rounds after each product before they sleep: on a machine with few cores
/// they take the cores from the kernels' rayon threads (BENCHMARKS.md). Unless the user set
/// `CANDLE_BARRIER_POOL_SPIN_LIMIT`, they spin briefly. Call it before the first product (the pool reads it once).
pub fn quiet_candle_pool() {
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "100");
    }
}
