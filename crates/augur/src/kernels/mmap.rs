//! Memory maps of safetensors files. Mapping a file is unsafe (the file could change under the map), so it lives
//! here with the crate's other unsafe code, behind one safe function.

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
