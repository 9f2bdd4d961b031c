//! Memory maps of safetensors files.

use std::path::PathBuf;

use candle_core::safetensors::MmapedSafetensors;

/// `files` mapped read-only as one set of tensors; on failure, also the first file that does not map alone.
pub fn safetensors(files: &[PathBuf]) -> Result<MmapedSafetensors, (candle_core::Error, Option<PathBuf>)> {
    // SAFETY: the files are mapped read-only; changing them while mapped is outside what a model load allows
    // (as for every reader of mapped weights).
    unsafe { MmapedSafetensors::multi(files) }.map_err(|e| {
        // SAFETY: as above.
        let bad = files.iter().find(|f| unsafe { MmapedSafetensors::new(f) }.is_err()).cloned();
        (e, bad)
    })
}
