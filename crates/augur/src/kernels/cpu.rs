//! The CPU features the kernels choose between, detected once per process: a kernel call does not pay for the
//! detection, and every call of a process takes the same path, so the same bits. The kernels' unsafe calls of
//! `#[target_feature]` functions rest on these flags.

use std::sync::OnceLock;

/// What this CPU runs, as the kernels group it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// AVX2 with FMA (the AVX2 attention unit).
    pub avx2_fma: bool,
    /// AVX2, FMA and F16C (the row-layout quantized products).
    pub avx2_fma_f16c: bool,
    /// AVX-512 F (attention, SiLU).
    pub avx512f: bool,
    /// AVX-512 F, BW and VNNI with F16C (the interleaved quantized products).
    pub avx512_vnni: bool,
    /// AMX-INT8 tiles with the kernel's permission for their state, beside AVX-512 VNNI (the tile products of
    /// 16 rows or more, [`super::amx`]).
    pub amx_int8: bool,
}

/// This machine's features (detected on the first call).
pub fn features() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    let has = |f: &str| match f {
        "avx2" => is_x86_feature_detected!("avx2"),
        "fma" => is_x86_feature_detected!("fma"),
        "f16c" => is_x86_feature_detected!("f16c"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "avx512vnni" => is_x86_feature_detected!("avx512vnni"),
        _ => false,
    };
    let avx2_fma = has("avx2") && has("fma");
    let avx512f = has("avx512f");
    let avx512_vnni = avx512f && has("avx512bw") && has("avx512vnni") && has("f16c");
    Features {
        avx2_fma,
        avx2_fma_f16c: avx2_fma && has("f16c"),
        avx512f,
        avx512_vnni,
        amx_int8: avx512_vnni && super::amx::request(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features { avx2_fma: false, avx2_fma_f16c: false, avx512f: false, avx512_vnni: false, amx_int8: false }
}
