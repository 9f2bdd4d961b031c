//! AMX int8 tile products: the integer dot products of 16 activation rows with 16 weight rows over one block of
//! 32 (or 16) elements, in one `tdpbssd`. The block families ([`super::quant`]) scale and sum them in their VNNI
//! kernels' order: a block's integer dot product is exact either way, so a row gets the same bits through tiles
//! as through VNNI, and any product of 16 rows or more (a prompt's prefill, a large batched forward) can take
//! tiles for all but its last rows.
//!
//! Written with `asm!`: Rust's AMX intrinsics are not stable. Tiles need the kernel's permission for their
//! state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`), asked once per process ([`request`], from
//! [`super::cpu::features`]); where the CPU lacks AMX-INT8, the kernel refuses, or `AUGUR_AMX=off` is set, no
//! tile is used and VNNI serves every row.

use std::marker::PhantomData;

/// Activation rows (and weight rows) of one tile product.
pub(crate) const ROWS: usize = 16;

/// Tile products run so far in this process: the tests comparing tile rows with VNNI rows check that tiles
/// served them.
#[cfg(test)]
pub(crate) static PRODUCTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Whether tiles serve products here, said loudly by the tests where they do not (their comparisons then
/// cover VNNI rows only).
#[cfg(test)]
pub(crate) fn tested_here(what: &str) -> bool {
    let on = super::cpu::features().amx_int8;
    if !on {
        eprintln!("NOTE: AMX tiles are not available on this machine: {what} compares VNNI rows only");
    }
    on
}

/// The permission for tile state, asked of the kernel: true where the CPU has AMX-TILE and AMX-INT8, the
/// kernel grants the state, and `AUGUR_AMX` is not `off` (or `0`).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) fn request() -> bool {
    if matches!(std::env::var("AUGUR_AMX").as_deref(), Ok("off" | "0")) {
        return false;
    }
    // CPUID leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (0b11 << 24) != 0b11 << 24 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    const SYS_ARCH_PRCTL: i64 = 158;
    let rc: i64;
    // SAFETY: the arch_prctl system call with ARCH_REQ_XCOMP_PERM only asks for a permission; it reads and
    // writes no memory of ours, and clobbers rcx and r11 (declared) as every syscall does.
    unsafe {
        std::arch::asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => rc, in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    rc == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
pub(crate) fn request() -> bool {
    false
}

/// The tile configuration (palette 1), 64 bytes as `ldtilecfg` reads them: tmm0 and tmm1 hold 16 activation rows
/// of 32 bytes, tmm2 and tmm3 the 32 × 16 weights as 8 rows of 16 × 4 bytes, tmm4 and tmm5 the same for blocks of
/// 16 (16 × 16 bytes, 4 rows), tmm6 and tmm7 the 16 × 16 int32 results.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
    tail: [u8; 16],
}

const CONFIG: Config = {
    let mut colsb = [0u16; 16];
    let mut rows = [0u8; 16];
    let shapes: [(u16, u8); 8] = [(32, 16), (32, 16), (64, 8), (64, 8), (16, 16), (64, 4), (64, 16), (64, 16)];
    let mut t = 0;
    while t < 8 {
        (colsb[t], rows[t]) = shapes[t];
        t += 1;
    }
    Config { palette: 1, start_row: 0, reserved: [0; 14], colsb, rows, tail: [0; 16] }
};

/// The tile registers configured on this thread, released when dropped. Not `Send`: tile state is a thread's.
pub(crate) struct Tiles {
    _thread: PhantomData<*const ()>,
}

impl Tiles {
    /// Configures the tiles on this thread; `None` where tiles are not available ([`request`] refused).
    pub(crate) fn configure() -> Option<Self> {
        if !super::cpu::features().amx_int8 {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: tile state was granted (`features().amx_int8`); `CONFIG` is a valid palette-1 configuration
        // of 64 bytes.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly))
        };
        Some(Self { _thread: PhantomData })
    }

    /// For each block `i < c.len()` of `BLOCK` (32 or 16) elements:
    /// `c[i][r · 16 + j] = Σ_t a[r · a_stride + i · BLOCK + t] · b[i · 16 · BLOCK + (t / 4) · 64 + 4j + t % 4]`,
    /// the dot products of 16 activation rows (`a`, row-major at `a_stride` bytes) with 16 weight rows (`b`,
    /// each block as the tile's rows of 16 × 4 integers).
    ///
    /// # Safety
    /// `a` is valid for reads of 16 rows of `c.len() · BLOCK` bytes at `a_stride`, and `b` of
    /// `c.len() · 16 · BLOCK` bytes.
    pub(crate) unsafe fn dots<const BLOCK: usize>(
        &self,
        a: *const i8,
        a_stride: usize,
        b: *const i8,
        c: &mut [[i32; ROWS * ROWS]],
    ) {
        #[cfg(test)]
        PRODUCTS.fetch_add(c.len(), std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("tiles are configured only on x86-64 ({a:?}, {a_stride}, {b:?}, {})", c.len());
        #[cfg(target_arch = "x86_64")]
        self.dots_x86::<BLOCK>(a, a_stride, b, c)
    }

    /// [`Self::dots`] on x86-64.
    ///
    /// # Safety
    /// As for [`Self::dots`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn dots_x86<const BLOCK: usize>(
        &self,
        a: *const i8,
        a_stride: usize,
        b: *const i8,
        c: &mut [[i32; ROWS * ROWS]],
    ) {
        const C_STRIDE: usize = ROWS * 4;
        // All the blocks on the tiles `$a0, $b0` and `$a1, $b1` (the same ones for blocks of 16): two at a time
        // on two sets, so that one product runs while the other's tiles load, their results in tmm6 and tmm7.
        macro_rules! blocks {
            ($a0:literal, $b0:literal, $a1:literal, $b1:literal) => {{
                let mut blocks = c.chunks_exact_mut(2);
                let mut i = 0;
                for pair in &mut blocks {
                    let (c0, c1) = pair.split_at_mut(1);
                    // SAFETY: the caller vouches for `a` and `b` over these two blocks; `c0` and `c1` are 16 rows
                    // of 64 bytes each; the tiles were configured on this thread (`self`).
                    std::arch::asm!(
                        concat!("tileloadd ", $a0, ", [{a0} + {sa} * 1]"),
                        concat!("tileloadd ", $b0, ", [{b0} + {sb} * 1]"),
                        "tilezero tmm6",
                        concat!("tdpbssd tmm6, ", $a0, ", ", $b0),
                        concat!("tileloadd ", $a1, ", [{a1} + {sa} * 1]"),
                        concat!("tileloadd ", $b1, ", [{b1} + {sb} * 1]"),
                        "tilezero tmm7",
                        concat!("tdpbssd tmm7, ", $a1, ", ", $b1),
                        "tilestored [{c0} + {sc} * 1], tmm6",
                        "tilestored [{c1} + {sc} * 1], tmm7",
                        a0 = in(reg) a.add(i * BLOCK), a1 = in(reg) a.add((i + 1) * BLOCK), sa = in(reg) a_stride,
                        b0 = in(reg) b.add(i * ROWS * BLOCK), b1 = in(reg) b.add((i + 1) * ROWS * BLOCK),
                        sb = in(reg) 64usize, c0 = in(reg) c0[0].as_mut_ptr(), c1 = in(reg) c1[0].as_mut_ptr(),
                        sc = in(reg) C_STRIDE, options(nostack),
                    );
                    i += 2;
                }
                if let [last] = blocks.into_remainder() {
                    // SAFETY: as above, for the one block left.
                    std::arch::asm!(
                        concat!("tileloadd ", $a0, ", [{a0} + {sa} * 1]"),
                        concat!("tileloadd ", $b0, ", [{b0} + {sb} * 1]"),
                        "tilezero tmm6",
                        concat!("tdpbssd tmm6, ", $a0, ", ", $b0),
                        "tilestored [{c0} + {sc} * 1], tmm6",
                        a0 = in(reg) a.add(i * BLOCK), sa = in(reg) a_stride, b0 = in(reg) b.add(i * ROWS * BLOCK),
                        sb = in(reg) 64usize, c0 = in(reg) last.as_mut_ptr(), sc = in(reg) C_STRIDE, options(nostack),
                    );
                }
            }};
        }
        if BLOCK == 32 {
            blocks!("tmm0", "tmm2", "tmm1", "tmm3")
        } else {
            blocks!("tmm4", "tmm5", "tmm4", "tmm5")
        }
    }
}

/// Runs a tile kernel's `steps` steps: `ask(s, into)` asks the tiles for step s's products, `scale(s, from)`
/// scales them. Step s + 1's are asked for, into the other half of `dots`, before step s's are scaled, so that
/// the tiles work while the vector units scale.
#[inline(always)]
pub(crate) fn pipelined(
    dots: &mut [[i32; ROWS * ROWS]],
    steps: usize,
    mut ask: impl FnMut(usize, &mut [[i32; ROWS * ROWS]]),
    mut scale: impl FnMut(usize, &[[i32; ROWS * ROWS]]),
) {
    let half = dots.len() / 2;
    let (even, odd) = dots.split_at_mut(half);
    let halves = [even, &mut odd[..half]];
    if steps > 0 {
        ask(0, halves[0]);
    }
    for s in 0..steps {
        if s + 1 < steps {
            ask(s + 1, halves[(s + 1) % 2]);
        }
        scale(s, halves[s % 2]);
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured on this thread (`configure`); releasing them only resets tile state.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile dot products equal the scalar sums, for both block sizes and an odd number of blocks.
    #[test]
    fn dots_match_scalar_sums() {
        let Some(tiles) = Tiles::configure() else {
            eprintln!("AMX tiles not available here: the tile products are not exercised");
            return;
        };
        fn check<const BLOCK: usize>(tiles: &Tiles) {
            let (blocks, stride) = (3, 3 * BLOCK + 8);
            let a: Vec<i8> = (0..ROWS * stride).map(|i| (i * 7 % 255) as u8 as i8).collect();
            let b: Vec<i8> = (0..blocks * ROWS * BLOCK).map(|i| (i * 13 % 251) as u8 as i8).collect();
            let mut c = vec![[0i32; ROWS * ROWS]; blocks];
            // SAFETY: `a` holds 16 rows of `stride ≥ 3 · BLOCK` bytes, `b` three blocks.
            unsafe { tiles.dots::<BLOCK>(a.as_ptr(), stride, b.as_ptr(), &mut c) };
            for (i, c) in c.iter().enumerate() {
                for r in 0..ROWS {
                    for j in 0..ROWS {
                        let want: i32 = (0..BLOCK)
                            .map(|t| {
                                let w = b[i * ROWS * BLOCK + (t / 4) * 64 + 4 * j + t % 4];
                                a[r * stride + i * BLOCK + t] as i32 * w as i32
                            })
                            .sum();
                        assert_eq!(c[r * ROWS + j], want, "block {i} of {BLOCK}, row {r}, column {j}");
                    }
                }
            }
        }
        check::<32>(&tiles);
        check::<16>(&tiles);
    }
}
