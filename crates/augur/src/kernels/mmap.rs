//! Memory maps of safetensors files. Mapping a file is unsafe (the file could change under the map), so it lives
//! here with the crate's other unsafe code, behind one safe function.

use std::fs::File;
use std::path::Path;

pub use memmap2::Mmap;

/// `path` mapped read-only.
pub fn map(path: &Path) -> std::io::Result<Mmap> {
    let file = File::open(path)?;
    // SAFETY: the file is mapped read-only; changing it while mapped is outside what a model load allows (as for
    // every reader of mapped weights).
    unsafe { Mmap::map(&file) }
}
