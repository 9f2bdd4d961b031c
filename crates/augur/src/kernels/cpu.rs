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
    /// An Intel core: the K-quant tiles prefetch further ahead, into L2 (`kquants::prefetch_eighth`).
    pub far_prefetch: bool,
}

/// The instruction set the quantized products run on, chosen from the CPU's features: one choice for every
/// family of blocks (32-element and K types alike), so that one name says which kernels a machine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F, BW and VNNI with F16C, and AVX2 with FMA: 16 weight rows per register.
    Avx512Vnni,
    /// AVX2, FMA and F16C: 8 weight rows per register.
    Avx2,
    /// Neither: the portable kernels.
    Portable,
}

impl Isa {
    /// The best this CPU runs.
    pub fn detect() -> Self {
        let f = features();
        if f.avx2_fma_f16c && f.avx512_vnni {
            Isa::Avx512Vnni
        } else if f.avx2_fma_f16c {
            Isa::Avx2
        } else {
            Isa::Portable
        }
    }

    /// Whether it is one of the vector sets (the interleaved layouts' tiles).
    pub fn is_simd(self) -> bool {
        self != Isa::Portable
    }

    /// Every vector set this CPU runs, best first (the tests compare them).
    pub fn simd_here() -> Vec<Self> {
        match Self::detect() {
            Isa::Avx512Vnni => vec![Isa::Avx512Vnni, Isa::Avx2],
            Isa::Avx2 => vec![Isa::Avx2],
            Isa::Portable => Vec::new(),
        }
    }
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
        far_prefetch: intel(),
    }
}

/// Whether the CPU's vendor string (CPUID leaf 0) is "GenuineIntel".
#[cfg(target_arch = "x86_64")]
fn intel() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).eq(*b"GenuineIntel")
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features {
        avx2_fma: false,
        avx2_fma_f16c: false,
        avx512f: false,
        avx512_vnni: false,
        amx_int8: false,
        far_prefetch: false,
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    use super::*;

    /// The library is compiled for the x86-64 baseline, so every extension a kernel uses is chosen at run time
    /// (a binary built here runs on a machine without AVX2); and what run time detects is what the kernel lists
    /// in /proc/cpuinfo, so no kernel runs an extension this CPU lacks (AVX-VNNI, AMX and AVX-512 included).
    #[test]
    #[allow(clippy::assertions_on_constants)] // the constant is what is tested: how this build was configured
    fn extensions_are_chosen_at_run_time_from_the_cpus_own_flags() {
        assert!(
            !cfg!(target_feature = "avx2") && !cfg!(target_feature = "avx512f"),
            "built with AVX2 or AVX-512 enabled at compile time (a target-cpu flag?): the binary would not run on \
             every x86-64 machine"
        );
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo is readable on Linux");
        let flags: Vec<&str> =
            cpuinfo.lines().find(|l| l.starts_with("flags")).expect("a flags line").split_whitespace().collect();
        let has = |f: &str| flags.contains(&f);
        let f = features();
        assert_eq!(f.avx2_fma, has("avx2") && has("fma"), "{f:?}");
        assert_eq!(f.avx2_fma_f16c, f.avx2_fma && has("f16c"), "{f:?}");
        assert_eq!(f.avx512f, has("avx512f"), "{f:?}");
        assert_eq!(f.avx512_vnni, has("avx512f") && has("avx512bw") && has("avx512_vnni") && has("f16c"), "{f:?}");
        assert!(!f.amx_int8 || has("amx_int8"), "AMX chosen on a CPU that does not list it: {f:?}");
        let intel = cpuinfo.lines().any(|l| l.starts_with("vendor_id") && l.ends_with("GenuineIntel"));
        assert_eq!(f.far_prefetch, intel, "the far prefetch is Intel's alone: {f:?}");
    }
}
