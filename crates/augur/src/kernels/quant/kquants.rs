//! Matrix products for the 256-element GGUF "K" types Q4_K and Q6_K (most of Qwen2.5-Coder-1.5B's Q4_K_M
//! file, and the FFN down projections of the 0.5B), on AVX-512 VNNI machines and on AVX2 machines. Candle's
//! kernels for them pay for eight rows several times what they pay for one, which is what verification pays;
//! here the weights are read once for up to eight rows.
//!
//! The arithmetic is llama.cpp's: activations quantized per 256 elements to 8 bits (Q8_K: one f32 scale and
//! integer sums per 16), integer dot products per sub-block, scaled by the sub-block's integer scale, then by
//! the super-block scales. Each output element gets the same operations in the same order whatever the number
//! of rows and whichever instruction set runs them (the integer sums are exact, the float steps are the same
//! fused operations), so a token verified in a block gets the bits it gets decoded alone, on every x86 machine.
//!
//! At load the weights are regrouped by 16 rows, as for the 32-element types (see `blocks32`): one
//! `vpdpbusd` multiplies 4 weights of each of 16 rows by the same 4 activations, and the 16 sums land in one
//! register, with no horizontal sums; AVX2 takes the same layout 8 rows at a time (`vpmaddubsw` then
//! `vpmaddwd`), its six-bit scales and mins decoded once at load, not per product. The regrouped bytes are as
//! many as the file's.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

use super::{
    over_groups, regroup, rows_of, ActFormat, AmxTile, GroupTiles, QuantKernel, RowReader, SharedActivations,
    SharedKernel, AVX2_TILE, GROUP, GROUP_TILE,
};
use crate::error::{Error, Result};
use crate::kernels::cpu::Isa;

/// Elements per super-block.
const QK_K: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KKind {
    /// `d, dmin: f16, scales: [u8; 12] (8 six-bit scales and mins), qs: [u8; 128]`: value
    /// `d·sc_j·q − dmin·m_j` for sub-block j of 32, q in 0..16.
    Q4K,
    /// `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`: value `d·sc_j·(q − 32)` for sub-block j of 16,
    /// q in 0..64.
    Q6K,
}

impl KKind {
    fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4K => Some(KKind::Q4K),
            GgmlDType::Q6K => Some(KKind::Q6K),
            _ => None,
        }
    }

    /// Bytes of one row's super-block in the file.
    fn block_bytes(self) -> usize {
        match self {
            KKind::Q4K => 144,
            KKind::Q6K => 210,
        }
    }

    /// Bytes of a 16-row group's super-block here: Q6_K's are the file's; Q4_K's six-bit scales and mins
    /// are held as bytes (64 more than the file's 2304, 3%).
    fn group_bytes(self) -> usize {
        match self {
            KKind::Q4K => Q4K_D + 64,
            KKind::Q6K => Q6K_D + 32,
        }
    }
}

// Offsets inside an interleaved group super-block.
/// Q4_K and Q6_K: the low four bits of 16 rows × 256 integers, eight 256-byte chunks of 32 columns, each
/// arranged as four vectors of (16 rows × 4 columns) whose high nibbles hold the next four vectors.
const NIBBLES: usize = 0;
/// Q4_K: the 8 scales of the 16 rows, `[8][16]` u8.
const Q4K_SCALES: usize = 2048;
/// Q4_K: the 8 mins as pairs, `[4][16][2]` u8 (one `vpdpwssd` takes a pair per row).
const Q4K_MINS: usize = 2048 + 128;
/// Q4_K: `d` then `dmin`, `[16]` f16 each.
const Q4K_D: usize = 2048 + 256;
/// Q6_K: the fifth and sixth bits, `[8 chunks][2][64]`: byte b of the first 64 holds, in bits 2v..2v+2, the
/// high bits of byte b of the chunk's vector v (v < 4); the second 64 bytes, vectors 4..8.
const Q6K_HIGH: usize = 2048;
/// Q6_K: the 16 scales of the 16 rows, `[16][16]` i8.
const Q6K_SCALES: usize = 2048 + 1024;
/// Q6_K: `d`, `[16]` f16.
const Q6K_D: usize = 2048 + 1024 + 256;

/// A Q4_K or Q6_K weight `[n, k]`, regrouped for the VNNI and AVX2 kernels.
#[derive(Debug)]
pub struct SuperBlockMatrix {
    kind: KKind,
    isa: Isa,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

impl SuperBlockMatrix {
    /// `Some` for Q4_K and Q6_K on machines with AVX-512 (F, BW, VNNI) or AVX2 (with FMA), and F16C.
    pub fn from_qtensor(q: &QTensor) -> Result<Option<Self>> {
        match Isa::detect() {
            Isa::Portable => Ok(None),
            isa => Self::from_qtensor_on(q, isa),
        }
    }

    /// As [`Self::from_qtensor`] on `isa`, one of [`Isa::simd_here`] (the unsafe tiles rest on it).
    fn from_qtensor_on(q: &QTensor, isa: Isa) -> Result<Option<Self>> {
        let Some(kind) = KKind::of(q.dtype()).filter(|_| isa.is_simd()) else { return Ok(None) };
        let (n, k) = q.shape().dims2()?;
        if !k.is_multiple_of(QK_K) {
            return Ok(None);
        }
        let data = q.data()?;
        let expected = n * (k / QK_K) * kind.block_bytes();
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                name: format!("{kind:?} block data of a [{n}, {k}] tensor (bytes)"),
                expected: vec![expected],
                actual: vec![data.len()],
            });
        }
        let data = interleave(kind, n, k, &mut rows_of(&data, expected / n.max(1)))?;
        Ok(Some(Self { kind, isa, n, k, data }))
    }

    /// As [`Self::from_qtensor`], from the stored rows 16 at a time: the tensor is never held twice while it is
    /// regrouped.
    pub fn from_stored(dtype: GgmlDType, n: usize, k: usize, read: &mut RowReader) -> Result<Option<Self>> {
        let Some(kind) = KKind::of(dtype) else { return Ok(None) };
        let isa = Isa::detect();
        if !isa.is_simd() {
            return Ok(None);
        }
        if !k.is_multiple_of(QK_K) {
            return Ok(None);
        }
        Ok(Some(Self { kind, isa, n, k, data: interleave(kind, n, k, read)? }))
    }

    /// `x`: `[m, k]` row-major → `[m, n]`.
    #[cfg(test)]
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_first(x, m, self.n)
    }
}

impl QuantKernel for SuperBlockMatrix {
    fn out_features(&self) -> usize {
        self.n
    }

    fn dtype(&self) -> GgmlDType {
        match self.kind {
            KKind::Q4K => GgmlDType::Q4K,
            KKind::Q6K => GgmlDType::Q6K,
        }
    }

    fn matmul_first(&self, x: &[f32], m: usize, n: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), m * self.k);
        let act = SharedKernel::quantize(self, x, m);
        let part = GroupTiles { n: n.min(self.n), ..self.group_tiles(&act) };
        over_groups(part, m)
    }

    fn shared(&self) -> Option<&dyn SharedKernel> {
        Some(self)
    }
}

impl SharedKernel for SuperBlockMatrix {
    fn format(&self) -> ActFormat {
        ActFormat::SuperBlocks { k: self.k }
    }

    fn quantize(&self, x: &[f32], m: usize) -> SharedActivations {
        SharedActivations::SuperBlocks(Q8KRows::quantize(x, m, self.k, self.isa))
    }

    fn group_tiles<'a>(&'a self, act: &'a SharedActivations) -> GroupTiles<'a> {
        let SharedActivations::SuperBlocks(act) = act else { unreachable!("activations of another format") };
        let kind = self.kind;
        let group_bytes = (self.k / QK_K) * kind.group_bytes();
        if self.isa == Isa::Avx2 {
            return GroupTiles {
                data: &self.data,
                n: self.n,
                group_bytes,
                rows: AVX2_TILE,
                amx: None,
                tile: Box::new(move |w, r0, rows, at, stride| {
                    // SAFETY: an `Isa::Avx2` matrix is only built where `Isa::simd_here` lists it; the tile reads whole
                    // super-blocks of `w` and checks the activation rows; `GroupTiles::run`'s caller vouches for
                    // `rows` (at most `AVX2_TILE`), `at` and `stride`.
                    unsafe { avx2::tile_fn(kind, rows)(w, act, r0, at, stride) }
                }),
            };
        }
        let amx = crate::kernels::cpu::features().amx_int8.then(|| AmxTile {
            unpacked_bytes: 16 * self.k,
            // SAFETY: AVX-512 F and BW were detected (an `Isa::Avx512Vnni` matrix is only built where they were).
            unpack: Box::new(move |w, out| unsafe { avx512::unpack_signed(kind, w, out) }),
            // SAFETY: AVX-512 F, BW, VNNI and F16C were detected; `run_rows` passes a group and its unpacked
            // integers, and its caller vouches for `at` and `stride` and the tiles of this thread.
            tile: Box::new(move |tiles, ints, r0, at, stride| unsafe {
                avx512::amx_tile(kind, tiles, ints, act, r0, (at, stride))
            }),
        });
        GroupTiles {
            data: &self.data,
            n: self.n,
            group_bytes,
            rows: GROUP_TILE,
            amx,
            tile: Box::new(move |w, r0, rows, at, stride| {
                // SAFETY: an `Isa::Avx512Vnni` matrix is only built where `Isa::simd_here` lists it; the tile reads
                // whole super-blocks of `w` and checks the activation rows; `GroupTiles::run`'s caller vouches
                // for `rows`, `at` and `stride`.
                unsafe { avx512::tile_fn(kind, rows)(w, act, r0, at, stride) }
            }),
        }
    }
}

/// One row's super-block unpacked: the integers (Q4_K 0..16, Q6_K 0..64), the integer scales per sub-block
/// (Q4_K 8, Q6_K 16), the Q4_K mins, and `d`, `dmin`.
struct Unpacked {
    q: [u8; QK_K],
    scales: [i8; 16],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

fn unpack(kind: KKind, b: &[u8]) -> Unpacked {
    let f16_at = |i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let mut u = Unpacked { q: [0; QK_K], scales: [0; 16], mins: [0; 8], d: 0.0, dmin: 0.0 };
    match kind {
        KKind::Q4K => {
            (u.d, u.dmin) = (f16_at(0), f16_at(2));
            let s = &b[4..16];
            for j in 0..8 {
                // ggml's `get_scale_min_k4`.
                let (sc, m) = if j < 4 {
                    (s[j] & 63, s[j + 4] & 63)
                } else {
                    ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
                };
                u.scales[j] = sc as i8;
                u.mins[j] = m;
            }
            let qs = &b[16..144];
            for (e, q) in u.q.iter_mut().enumerate() {
                let (j, l) = (e / 32, e % 32);
                let byte = qs[32 * (j / 2) + l];
                *q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            }
        }
        KKind::Q6K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            for (j, s) in u.scales.iter_mut().enumerate() {
                *s = b[192 + j] as i8;
            }
            u.d = f16_at(208);
            for (e, q) in u.q.iter_mut().enumerate() {
                // ggml's `dequantize_row_q6_K`: halves of 128, quarters of 32.
                let (h, t, l) = (e / 128, e % 128 / 32, e % 32);
                let low = ql[64 * h + 32 * (t % 2) + l];
                let low = if t < 2 { low & 0x0F } else { low >> 4 };
                let high = (qh[32 * h + l] >> (2 * t)) & 3;
                *q = low | (high << 4);
            }
        }
    }
    u
}

/// Regroups the file's row-major super-blocks `[n, k / 256]` into 16-row groups (see the offsets above);
/// rows past `n` (up to a multiple of 16) are zeros, whose scales 0 make their products 0.
fn interleave(kind: KKind, n: usize, k: usize, read: &mut RowReader) -> Result<Vec<u8>> {
    let nsb = k / QK_K;
    let (bytes, group_bytes) = (kind.block_bytes(), kind.group_bytes());
    regroup(n, nsb * bytes, nsb * group_bytes, read, |rows, group| {
        for (i, row) in rows.chunks_exact(nsb * bytes).enumerate() {
            for (src, dst) in row.chunks_exact(bytes).zip(group.chunks_exact_mut(group_bytes)) {
                place(kind, i, &unpack(kind, src), dst);
            }
        }
    })
}

/// Writes row `i` of a group's super-block.
fn place(kind: KKind, i: usize, u: &Unpacked, dst: &mut [u8]) {
    for chunk in 0..8 {
        let q = &u.q[32 * chunk..32 * (chunk + 1)];
        for v in 0..4 {
            for t in 0..4 {
                // Columns 4v + t in the low nibble, 16 + 4v + t in the high nibble.
                let (lo, hi) = (q[4 * v + t], q[16 + 4 * v + t]);
                dst[NIBBLES + chunk * 256 + v * 64 + 4 * i + t] = (lo & 0x0F) | ((hi & 0x0F) << 4);
                if kind == KKind::Q6K {
                    let high = &mut dst[Q6K_HIGH + chunk * 128..];
                    high[4 * i + t] |= (lo >> 4) << (2 * v);
                    high[64 + 4 * i + t] |= (hi >> 4) << (2 * v);
                }
            }
        }
    }
    let d_at = |off: usize| off + 2 * i;
    match kind {
        KKind::Q4K => {
            for j in 0..8 {
                dst[Q4K_SCALES + j * GROUP + i] = u.scales[j] as u8;
                dst[Q4K_MINS + (j / 2) * 32 + 2 * i + j % 2] = u.mins[j];
            }
            dst[d_at(Q4K_D)..][..2].copy_from_slice(&f16::from_f32(u.d).to_le_bytes());
            dst[d_at(Q4K_D + 32)..][..2].copy_from_slice(&f16::from_f32(u.dmin).to_le_bytes());
        }
        KKind::Q6K => {
            for j in 0..16 {
                dst[Q6K_SCALES + j * GROUP + i] = u.scales[j] as u8;
            }
            dst[d_at(Q6K_D)..][..2].copy_from_slice(&f16::from_f32(u.d).to_le_bytes());
        }
    }
}

/// `m` activation rows quantized as llama.cpp's Q8_K: per 256 elements `q = round(−127/max · x)` (`max` the
/// element of largest magnitude, with its sign) and the scale `d = max/−127` in f32.
pub struct Q8KRows {
    /// `[m, k]`.
    qs: Vec<i8>,
    /// `[m, k / 256]`.
    d: Vec<f32>,
    /// Integer sums of each 16 elements, `[m, k / 16]`.
    sum16: Vec<i32>,
    /// Integer sums of each 32 elements as i16 pairs (sub-blocks 2p and 2p + 1 in one i32), `[m, k / 64]`.
    sum32_pairs: Vec<i32>,
}

impl Q8KRows {
    fn quantize(x: &[f32], m: usize, k: usize, isa: Isa) -> Self {
        let nsb = m * (k / QK_K);
        let mut rows = Q8KRows {
            qs: vec![0; m * k],
            d: Vec::with_capacity(nsb),
            sum16: Vec::with_capacity(nsb * 16),
            sum32_pairs: Vec::with_capacity(nsb * 4),
        };
        for (src, dst) in x.chunks_exact(QK_K).zip(rows.qs.chunks_exact_mut(QK_K)) {
            let (d, sums) = match isa {
                // SAFETY: an `Isa::Avx512Vnni` matrix is only built where `Isa::simd_here` lists it; `src` and
                // `dst` are one super-block each (`chunks_exact`).
                Isa::Avx512Vnni => unsafe { avx512::quantize_superblock(src, dst) },
                Isa::Avx2 | Isa::Portable => quantize_superblock_portable(src, dst),
            };
            rows.d.push(d);
            for p in sums.chunks_exact(4) {
                let (a, b) = ((p[0] + p[1]) as i16, (p[2] + p[3]) as i16);
                rows.sum32_pairs.push((a as u16 as u32 | (b as u16 as u32) << 16) as i32);
            }
            rows.sum16.extend(sums);
        }
        rows
    }
}

/// One super-block of [`Q8KRows`] into `qs`: returns the scale and the sums of each 16 integers. The AVX2
/// kernels take it as it is (a few hundred elements per row of a decode step).
fn quantize_superblock_portable(src: &[f32], dst: &mut [i8]) -> (f32, [i32; 16]) {
    let max = src.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = if max == 0.0 {
        dst.fill(0);
        0.0
    } else {
        let iscale = -127.0 / max;
        for (q, &v) in dst.iter_mut().zip(src) {
            *q = (iscale * v).round().clamp(-128.0, 127.0) as i8;
        }
        1.0 / iscale
    };
    (d, std::array::from_fn(|j| dst[16 * j..16 * (j + 1)].iter().map(|&q| q as i32).sum()))
}

/// Prefetches the `part`-th eighth of the cache lines of a super-block ahead of the one of `bytes` bytes at
/// `blk`, read while this one is computed, by the VNNI and the AVX2 tiles: the hardware prefetcher alone leaves a
/// one-token product waiting on memory. Where [`Features::far_prefetch`] holds (Intel cores), two super-blocks
/// ahead into L2 (`T2`); elsewhere the next one into L1 (`T0`): each is what measured fastest on its machines
/// (BENCHMARKS.md, issue 38).
///
/// [`Features::far_prefetch`]: crate::kernels::cpu::Features::far_prefetch
#[inline]
fn prefetch_eighth(blk: *const u8, bytes: usize, part: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T2};
    let far = crate::kernels::cpu::features().far_prefetch;
    let next = blk.wrapping_add(if far { 2 * bytes } else { bytes });
    let lines = bytes.div_ceil(64);
    for line in part * lines / 8..(part + 1) * lines / 8 {
        let at = next.wrapping_add(64 * line) as *const i8;
        // SAFETY: SSE is part of x86-64; a prefetch never faults, whatever the address (formed with wrapping
        // arithmetic).
        unsafe {
            if far {
                _mm_prefetch::<_MM_HINT_T2>(at)
            } else {
                _mm_prefetch::<_MM_HINT_T0>(at)
            }
        };
    }
}

mod avx512 {
    use std::arch::x86_64::*;

    use super::{
        prefetch_eighth, KKind, Q8KRows, NIBBLES, Q4K_D, Q4K_MINS, Q4K_SCALES, Q6K_D, Q6K_HIGH, Q6K_SCALES, QK_K,
    };
    use crate::kernels::amx::{pipelined, Tiles, ROWS};
    use crate::kernels::quant::{GroupInts, GROUP_TILE};

    /// [`super::quantize_superblock_portable`] with 512-bit registers: the same operations per element (rounding
    /// half away from zero as `f32::round`), so the same bits.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW, and `src` and `dst` hold at least 256 values each (they are read and
    /// written through raw pointers; the lengths are checked in debug builds only).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantize_superblock(src: &[f32], dst: &mut [i8]) -> (f32, [i32; 16]) {
        debug_assert!(src.len() == QK_K && dst.len() == QK_K);
        let x: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(src.as_ptr().add(16 * j)));
        let amax = _mm512_reduce_max_ps(x.iter().fold(_mm512_setzero_ps(), |m, v| _mm512_max_ps(m, _mm512_abs_ps(*v))));
        if amax == 0.0 {
            dst.fill(0);
            return (0.0, [0; 16]);
        }
        // The first element of largest magnitude, with its sign.
        let at = x.iter().enumerate().find_map(|(j, v)| {
            let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(*v), _mm512_set1_ps(amax));
            (hit != 0).then(|| 16 * j + hit.trailing_zeros() as usize)
        });
        let max = src[at.expect("an element has the largest magnitude")];
        let iscale = -127.0 / max;
        let (scale, half, one) = (_mm512_set1_ps(iscale), _mm512_set1_ps(0.5), _mm512_set1_ps(1.0));
        let sign = _mm512_set1_epi32(i32::MIN);
        let mut sums = [0i32; 16];
        for (j, v) in x.iter().enumerate() {
            let v = _mm512_mul_ps(*v, scale);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(v);
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(v, t)), half);
            let unit = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(_mm512_castps_si512(v), sign),
                _mm512_castps_si512(one),
            ));
            let q = _mm512_cvttps_epi32(_mm512_mask_add_ps(t, away, t, unit));
            _mm_storeu_si128(dst.as_mut_ptr().add(16 * j) as *mut __m128i, _mm512_cvtsepi32_epi8(q));
            sums[j] = _mm512_reduce_add_epi32(q);
        }
        (1.0 / iscale, sums)
    }

    /// A `q4k_tile` or `q6k_tile` instance for `R` rows: `tile(w, act, r0, out, stride)`.
    ///
    /// Calling one is safe when the CPU supports AVX-512 F, BW, VNNI and F16C, and `out` is valid for writes of
    /// `out[r · stride .. r · stride + 16]` for each `r < R`, elements no other thread accesses meanwhile. The
    /// tile reads only the whole super-blocks of `w`, and checks the activation rows `r0..r0 + R` against `act`.
    pub type TileFn = unsafe fn(&[u8], &Q8KRows, usize, *mut f32, usize);

    /// The instance compiled for `kind` and `rows` (1 to [`GROUP_TILE`]).
    pub fn tile_fn(kind: KKind, rows: usize) -> TileFn {
        macro_rules! rows {
            ($f:ident) => {
                match rows {
                    1 => $f::<1>,
                    2 => $f::<2>,
                    3 => $f::<3>,
                    4 => $f::<4>,
                    5 => $f::<5>,
                    6 => $f::<6>,
                    7 => $f::<7>,
                    _ => $f::<GROUP_TILE>,
                }
            };
        }
        match kind {
            KKind::Q4K => rows!(q4k_tile),
            KKind::Q6K => rows!(q6k_tile),
        }
    }

    /// The eight 16-row × 4-column vectors of 32 columns (`chunk`), low nibbles only.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW; `chunk < 8` and `blk` is valid for reads of a group super-block's
    /// integers (`NIBBLES + 2048` bytes).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn nibbles(blk: *const u8, chunk: usize) -> [__m512i; 8] {
        let low = _mm512_set1_epi8(0x0F);
        let mut wq = [_mm512_setzero_si512(); 8];
        for c in 0..4 {
            let v = _mm512_loadu_si512(blk.add(NIBBLES + chunk * 256 + 64 * c) as *const _);
            wq[c] = _mm512_and_si512(v, low);
            wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        wq
    }

    /// A Q4_K group super-block's closing terms (`d`, `dmin` and the mins of its 16 rows), which the VNNI and the
    /// AMX tiles both add the same way: `acc + sum · d·d_a − (Σ mins · sums of 32) · dmin·d_a`.
    struct Q4kClose {
        d: __m512,
        dmin: __m512,
        mins: [__m512i; 4],
    }

    impl Q4kClose {
        /// # Safety
        /// The CPU supports AVX-512 F, BW and F16C, and `blk` is valid for reads of a Q4_K group super-block.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,f16c")]
        unsafe fn of(blk: *const u8) -> Self {
            Self {
                d: _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q4K_D) as *const _)),
                dmin: _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q4K_D + 32) as *const _)),
                mins: std::array::from_fn(|p| {
                    _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(Q4K_MINS + 32 * p) as *const _))
                }),
            }
        }

        /// `acc` plus activation super-block `row_sb`'s (row and super-block) scaled `sum` less its mins' term.
        ///
        /// # Safety
        /// The CPU supports AVX-512 F and VNNI (`row_sb` is checked against `act`).
        #[inline]
        #[target_feature(enable = "avx512f,avx512vnni")]
        unsafe fn add(&self, acc: __m512, sum: __m512, act: &Q8KRows, row_sb: usize) -> __m512 {
            let mut msum = _mm512_setzero_si512();
            for (p, m) in self.mins.iter().enumerate() {
                msum = _mm512_dpwssd_epi32(msum, *m, _mm512_set1_epi32(act.sum32_pairs[row_sb * 4 + p]));
            }
            let da = _mm512_set1_ps(act.d[row_sb]);
            let acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(self.d, da), acc);
            _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum), _mm512_mul_ps(self.dmin, da), acc)
        }
    }

    /// The Q6_K integers (0..64) of 32 columns (`chunk`): [`nibbles`] with the fifth and sixth bits.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW; `chunk < 8` and `blk` is valid for reads of a Q6_K group super-block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn q6k_ints(blk: *const u8, chunk: usize) -> [__m512i; 8] {
        let three = _mm512_set1_epi8(0x30);
        let mut wq = nibbles(blk, chunk);
        for half in 0..2 {
            let h = _mm512_loadu_si512(blk.add(Q6K_HIGH + chunk * 128 + 64 * half) as *const _);
            // Bits 2v..2v+2 of each byte, moved to bits 4..6.
            let fifth = [
                _mm512_and_si512(_mm512_slli_epi16(h, 4), three),
                _mm512_and_si512(_mm512_slli_epi16(h, 2), three),
                _mm512_and_si512(h, three),
                _mm512_and_si512(_mm512_srli_epi16(h, 2), three),
            ];
            for (v, f) in fifth.iter().enumerate() {
                wq[4 * half + v] = _mm512_or_si512(wq[4 * half + v], *f);
            }
        }
        wq
    }

    /// Row `r` of a tile result as floats.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F (`r < 16` is checked).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_row(dots: &[i32; ROWS * ROWS], r: usize) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_loadu_si512(dots[ROWS * r..][..ROWS].as_ptr() as *const _))
    }

    /// A group's integers (`w`: whole group super-blocks of `kind`) as the AMX tiles take them, signed: per
    /// super-block and chunk of 32 columns, the 8 vectors of [`nibbles`] (Q4_K) or of [`q6k_ints`] less 32
    /// (Q6_K), 512 bytes. A Q4_K chunk is one 32-column tile block; a Q6_K chunk is two of 16 columns.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW (the lengths are checked).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn unpack_signed(kind: KKind, w: &[u8], out: &mut [i8]) {
        let bytes = kind.group_bytes();
        assert_eq!(out.len(), w.len() / bytes * 16 * QK_K, "unpacked bytes of a {kind:?} group");
        let offset = _mm512_set1_epi8(if kind == KKind::Q6K { 32 } else { 0 });
        for (blk, dst) in w.chunks_exact(bytes).zip(out.chunks_exact_mut(16 * QK_K)) {
            for chunk in 0..8 {
                let ints =
                    if kind == KKind::Q6K { q6k_ints(blk.as_ptr(), chunk) } else { nibbles(blk.as_ptr(), chunk) };
                for (v, ints) in ints.iter().enumerate() {
                    let at = dst.as_mut_ptr().add(512 * chunk + 64 * v);
                    _mm512_storeu_si512(at as *mut _, _mm512_sub_epi8(*ints, offset));
                }
            }
        }
    }

    /// [`q4k_tile`] or [`q6k_tile`] for 16 activation rows through AMX tiles: per super-block the integer dot
    /// products of its sub-blocks (8 of 32 columns, or 16 of 16) from [`Tiles::dots`] against the group's
    /// `unpacked` integers (the next super-block's asked for before these are scaled, so that the tiles work
    /// while the vector units scale), then per row the same scaling and sums as the VNNI tile, in the same
    /// order, so the same bits.
    ///
    /// # Safety
    /// AVX-512 F, BW, VNNI and F16C; `tiles` configured on this thread; `w` one group of `kind`, `unpacked`
    /// its [`unpack_signed`] integers and `dots` room for 32 tile results; `out` valid for writes of 16 floats
    /// at each `r · stride`, `r < 16`, that no other thread accesses meanwhile. The activation rows are checked.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub unsafe fn amx_tile(
        kind: KKind,
        tiles: &Tiles,
        (w, unpacked, dots): GroupInts,
        act: &Q8KRows,
        r0: usize,
        (out, stride): (*mut f32, usize),
    ) {
        let bytes = kind.group_bytes();
        let nsb = w.len() / bytes;
        let k = nsb * QK_K;
        assert!((r0 + ROWS) * k <= act.qs.len(), "activation rows {r0}..+16");
        assert!(unpacked.len() == nsb * 16 * QK_K && dots.len() >= 32, "unpacked integers of the group");
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let ask = |s: usize, into: &mut [[i32; ROWS * ROWS]]| {
            let a = act.qs.as_ptr().add(r0 * k + s * QK_K);
            let b = unpacked.as_ptr().add(s * 16 * QK_K);
            // SAFETY: 16 activation rows of `k` from r0 exist (checked), of which this super-block's 256 bytes
            // are read; `unpacked` holds every super-block (checked).
            unsafe {
                if kind == KKind::Q4K {
                    tiles.dots::<32>(a, k, b, &mut into[..8]);
                } else {
                    tiles.dots::<16>(a, k, b, &mut into[..16]);
                }
            }
        };
        let scale = |s: usize, dots: &[[i32; ROWS * ROWS]]| {
            let blk = w.as_ptr().add(s * bytes);
            if kind == KKind::Q4K {
                let sc: [__m512; 8] = std::array::from_fn(|j| {
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(Q4K_SCALES + 16 * j) as *const _)))
                });
                let close = Q4kClose::of(blk);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let mut sum = _mm512_setzero_ps();
                    for (j, sc) in sc.iter().enumerate() {
                        sum = _mm512_fmadd_ps(tile_row(&dots[j], r), *sc, sum);
                    }
                    *acc = close.add(*acc, sum, act, (r0 + r) * nsb + s);
                }
            } else {
                let sc: [__m512; 16] = std::array::from_fn(|j| {
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(Q6K_SCALES + 16 * j) as *const _)))
                });
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q6K_D) as *const _));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let mut sum = _mm512_setzero_ps();
                    for (j, sc) in sc.iter().enumerate() {
                        sum = _mm512_fmadd_ps(tile_row(&dots[j], r), *sc, sum);
                    }
                    let da = _mm512_set1_ps(act.d[(r0 + r) * nsb + s]);
                    *acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, da), *acc);
                }
            }
        };
        pipelined(&mut dots[..32], nsb, ask, scale);
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * stride), *acc);
        }
    }

    /// Σ over 4 vectors of 4 columns: `init + Σ_c wq[c] · a[4c..4c + 4]`, in two chains.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and VNNI, and `a` is valid for reads of 4 i32 (16 bytes, any alignment).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dot16(init: __m512i, wq: &[__m512i], a: *const i32) -> __m512i {
        let y = |c: usize| _mm512_set1_epi32(a.add(c).read_unaligned());
        let d0 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, wq[0], y(0)), wq[2], y(2));
        let d1 = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq[1], y(1)), wq[3], y(3));
        _mm512_add_epi32(d0, d1)
    }

    /// `Σ_c wq[c] · a[4c..4c + 4]` over 32 columns, in two chains.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and VNNI, and `a` is valid for reads of 8 i32 (32 bytes, any alignment).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dot32(wq: &[__m512i; 8], a: *const i32) -> __m512i {
        let y = |c: usize| _mm512_set1_epi32(a.add(c).read_unaligned());
        let (mut d0, mut d1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for c in (0..8).step_by(2) {
            d0 = _mm512_dpbusd_epi32(d0, wq[c], y(c));
            d1 = _mm512_dpbusd_epi32(d1, wq[c + 1], y(c + 1));
        }
        _mm512_add_epi32(d0, d1)
    }

    /// `R` activation rows (from `r0`) against one 16-row group of Q4_K super-blocks: writes
    /// `out[r · stride .. r · stride + 16]` for each.
    ///
    /// # Safety
    /// As for a [`TileFn`]: AVX-512 F, BW, VNNI and F16C, and `out` valid for writes of 16 floats at each
    /// `r · stride`, `r < R`, that no other thread accesses meanwhile.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    unsafe fn q4k_tile<const R: usize>(w: &[u8], act: &Q8KRows, r0: usize, out: *mut f32, stride: usize) {
        let bytes = KKind::Q4K.group_bytes();
        let nsb = w.len() / bytes;
        let k = nsb * QK_K;
        // The activations are read unchecked below.
        assert!((r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let mut acc = [_mm512_setzero_ps(); R];
        for s in 0..nsb {
            let blk = w.as_ptr().add(s * bytes);
            let mut sums = [_mm512_setzero_ps(); R];
            for j in 0..8 {
                prefetch_eighth(blk, bytes, j);
                let wq = nibbles(blk, j);
                let sc =
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(Q4K_SCALES + 16 * j) as *const _)));
                for (r, sum) in sums.iter_mut().enumerate() {
                    let a = act.qs.as_ptr().add((r0 + r) * k + s * QK_K + 32 * j) as *const i32;
                    let dot = dot32(&wq, a);
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), sc, *sum);
                }
            }
            let close = Q4kClose::of(blk);
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = close.add(*acc, sums[r], act, (r0 + r) * nsb + s);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * stride), *acc);
        }
    }

    /// As [`q4k_tile`] for Q6_K: 16-column sub-blocks, each integer dot product starting from
    /// `−32 · Σ activations` (the held integers are `q + 32`).
    ///
    /// # Safety
    /// As for [`q4k_tile`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    unsafe fn q6k_tile<const R: usize>(w: &[u8], act: &Q8KRows, r0: usize, out: *mut f32, stride: usize) {
        let bytes = KKind::Q6K.group_bytes();
        let nsb = w.len() / bytes;
        let k = nsb * QK_K;
        // The activations are read unchecked below.
        assert!((r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let mut acc = [_mm512_setzero_ps(); R];
        for s in 0..nsb {
            let blk = w.as_ptr().add(s * bytes);
            let mut sums = [_mm512_setzero_ps(); R];
            for chunk in 0..8 {
                prefetch_eighth(blk, bytes, chunk);
                let wq = q6k_ints(blk, chunk);
                let scale = |j: usize| {
                    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(Q6K_SCALES + 16 * j) as *const _)))
                };
                let (sc0, sc1) = (scale(2 * chunk), scale(2 * chunk + 1));
                for (r, sum) in sums.iter_mut().enumerate() {
                    let row = r0 + r;
                    let a = act.qs.as_ptr().add(row * k + s * QK_K + 32 * chunk) as *const i32;
                    let s16 = (row * nsb + s) * 16 + 2 * chunk;
                    let lo = dot16(_mm512_set1_epi32(-32 * act.sum16[s16]), &wq[..4], a);
                    let hi = dot16(_mm512_set1_epi32(-32 * act.sum16[s16 + 1]), &wq[4..], a.add(4));
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), sc0, *sum);
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), sc1, *sum);
                }
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(Q6K_D) as *const _));
            for (r, acc) in acc.iter_mut().enumerate() {
                let da = _mm512_set1_ps(act.d[(r0 + r) * nsb + s]);
                *acc = _mm512_fmadd_ps(sums[r], _mm512_mul_ps(d, da), *acc);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * stride), *acc);
        }
    }
}

/// The interleaved layout on AVX2: each 64-byte vector of 16 rows × 4 columns is read as two halves of 8 rows,
/// and a half's products are `vpmaddubsw` (unsigned weights × signed activations, pairs summed in i16) then
/// `vpmaddwd` by ones (i32 per row). The pairs never saturate: a Q4_K weight is below 16 and a Q6_K one below
/// 64, and a Q8_K activation is at most 127 in magnitude, so eight Q4_K pairs (8 · 2 · 15 · 127) or two Q6_K
/// pairs (2 · 2 · 63 · 127) fit an i16. The integer sums are therefore the VNNI kernel's, and the float steps
/// after them are the same fused operations per output element, in the same order.
mod avx2 {
    use std::arch::x86_64::*;

    use super::{
        prefetch_eighth, KKind, Q8KRows, AVX2_TILE, NIBBLES, Q4K_D, Q4K_MINS, Q4K_SCALES, Q6K_D, Q6K_HIGH, Q6K_SCALES,
        QK_K,
    };

    /// A `q4k_tile` or `q6k_tile` instance for `R` rows: `tile(w, act, r0, out, stride)`.
    ///
    /// Calling one is safe when the CPU supports AVX2, FMA and F16C, and `out` is valid for writes of
    /// `out[r · stride .. r · stride + 16]` for each `r < R`, elements no other thread accesses meanwhile. The
    /// tile reads only the whole super-blocks of `w`, and checks the activation rows `r0..r0 + R` against `act`.
    pub type TileFn = unsafe fn(&[u8], &Q8KRows, usize, *mut f32, usize);

    /// The instance compiled for `kind` and `rows` (1 to [`AVX2_TILE`]).
    pub fn tile_fn(kind: KKind, rows: usize) -> TileFn {
        macro_rules! rows {
            ($f:ident) => {
                match rows {
                    1 => $f::<1>,
                    2 => $f::<2>,
                    3 => $f::<3>,
                    _ => $f::<AVX2_TILE>,
                }
            };
        }
        match kind {
            KKind::Q4K => rows!(q4k_tile),
            KKind::Q6K => rows!(q6k_tile),
        }
    }

    /// Half `half` (rows `8 · half ..`) of vector `c` of 32 columns (`chunk`): its low nibbles are columns
    /// `4c..4c + 4`, its high nibbles columns `16 + 4c..`, for `c < 4`.
    ///
    /// # Safety
    /// The CPU supports AVX2; `chunk < 8`, `c < 4`, `half < 2`, and `blk` is valid for reads of a group
    /// super-block's integers (`NIBBLES + 2048` bytes).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn packed(blk: *const u8, chunk: usize, c: usize, half: usize) -> __m256i {
        _mm256_loadu_si256(blk.add(NIBBLES + chunk * 256 + 64 * c + 32 * half) as *const _)
    }

    /// The 8 activation rows' broadcast of activation integers `4c..4c + 4` of row `a`.
    ///
    /// # Safety
    /// The CPU supports AVX; `a` is valid for reads of `c + 1` i32 (any alignment).
    #[inline]
    #[target_feature(enable = "avx")]
    unsafe fn four(a: *const i32, c: usize) -> __m256i {
        _mm256_set1_epi32(a.add(c).read_unaligned())
    }

    /// Eight rows' f32 values from 8 bytes at `at` (u8 or i8 by `signed`).
    ///
    /// # Safety
    /// The CPU supports AVX2; `at` is valid for reads of 8 bytes.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scales(at: *const u8, signed: bool) -> __m256 {
        let b = _mm_loadl_epi64(at as *const _);
        _mm256_cvtepi32_ps(if signed { _mm256_cvtepi8_epi32(b) } else { _mm256_cvtepu8_epi32(b) })
    }

    /// Eight rows' f16 values at `at` as f32.
    ///
    /// # Safety
    /// The CPU supports F16C; `at` is valid for reads of 16 bytes.
    #[inline]
    #[target_feature(enable = "avx,f16c")]
    unsafe fn halfs(at: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(at as *const _))
    }

    /// `R` activation rows (from `r0`) against one 16-row group of Q4_K super-blocks: writes
    /// `out[r · stride .. r · stride + 16]` for each. Up to two rows take both halves of each vector at once
    /// (each cache line read once); more rows take one half at a time, whose accumulators fit the registers.
    ///
    /// # Safety
    /// As for a [`TileFn`]: AVX2, FMA and F16C, and `out` valid for writes of 16 floats at each `r · stride`,
    /// `r < R`, that no other thread accesses meanwhile.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4k_tile<const R: usize>(w: &[u8], act: &Q8KRows, r0: usize, out: *mut f32, stride: usize) {
        if R <= 2 {
            q4k_halves::<R, 2>(w, act, r0, (out, stride), 0);
        } else {
            q4k_halves::<R, 1>(w, act, r0, (out, stride), 0);
            q4k_halves::<R, 1>(w, act, r0, (out, stride), 1);
        }
    }

    /// [`q4k_tile`] for the `H` halves of 8 weight rows from half `first`.
    ///
    /// # Safety
    /// As for [`q4k_tile`], with `first + H ≤ 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4k_halves<const R: usize, const H: usize>(
        w: &[u8],
        act: &Q8KRows,
        r0: usize,
        (out, stride): (*mut f32, usize),
        first: usize,
    ) {
        let bytes = KKind::Q4K.group_bytes();
        let nsb = w.len() / bytes;
        let k = nsb * QK_K;
        // The activations are read unchecked below.
        assert!((r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let (low, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_ps(); H]; R];
        for s in 0..nsb {
            let blk = w.as_ptr().add(s * bytes);
            let mut sums = [[_mm256_setzero_ps(); H]; R];
            for j in 0..8 {
                if first == 0 {
                    prefetch_eighth(blk, bytes, j);
                }
                let a: [*const i32; R] =
                    std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + s * QK_K + 32 * j) as *const i32);
                let mut dots = [[_mm256_setzero_si256(); H]; R];
                for c in 0..4 {
                    for h in 0..H {
                        let v = packed(blk, j, c, first + h);
                        let (lo, hi) = (_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
                        for (r, dot) in dots.iter_mut().enumerate() {
                            let pair = _mm256_add_epi16(
                                _mm256_maddubs_epi16(lo, four(a[r], c)),
                                _mm256_maddubs_epi16(hi, four(a[r], c + 4)),
                            );
                            dot[h] = _mm256_add_epi16(dot[h], pair);
                        }
                    }
                }
                for h in 0..H {
                    let sc = scales(blk.add(Q4K_SCALES + 16 * j + 8 * (first + h)), false);
                    for (sum, dot) in sums.iter_mut().zip(&dots) {
                        sum[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(dot[h], ones)), sc, sum[h]);
                    }
                }
            }
            for h in 0..H {
                let half = first + h;
                let (d, dmin) = (halfs(blk.add(Q4K_D + 16 * half)), halfs(blk.add(Q4K_D + 32 + 16 * half)));
                let mins: [__m256i; 4] = std::array::from_fn(|p| {
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(Q4K_MINS + 32 * p + 16 * half) as *const _))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let row_sb = (r0 + r) * nsb + s;
                    let mut msum = _mm256_setzero_si256();
                    for (p, m) in mins.iter().enumerate() {
                        let pairs = _mm256_set1_epi32(act.sum32_pairs[row_sb * 4 + p]);
                        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(*m, pairs));
                    }
                    let da = _mm256_set1_ps(act.d[row_sb]);
                    acc[h] = _mm256_fmadd_ps(sums[r][h], _mm256_mul_ps(d, da), acc[h]);
                    acc[h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, da), acc[h]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (h, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * stride + 8 * (first + h)), *acc);
            }
        }
    }

    /// As [`q4k_tile`] for Q6_K: 16-column sub-blocks, each integer dot product starting from
    /// `−32 · Σ activations` (the held integers are `q + 32`).
    ///
    /// # Safety
    /// As for [`q4k_tile`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6k_tile<const R: usize>(w: &[u8], act: &Q8KRows, r0: usize, out: *mut f32, stride: usize) {
        if R <= 2 {
            q6k_halves::<R, 2>(w, act, r0, (out, stride), 0);
        } else {
            q6k_halves::<R, 1>(w, act, r0, (out, stride), 0);
            q6k_halves::<R, 1>(w, act, r0, (out, stride), 1);
        }
    }

    /// [`q6k_tile`] for the `H` halves of 8 weight rows from half `first`.
    ///
    /// # Safety
    /// As for [`q4k_tile`], with `first + H ≤ 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6k_halves<const R: usize, const H: usize>(
        w: &[u8],
        act: &Q8KRows,
        r0: usize,
        (out, stride): (*mut f32, usize),
        first: usize,
    ) {
        let bytes = KKind::Q6K.group_bytes();
        let nsb = w.len() / bytes;
        let k = nsb * QK_K;
        // The activations are read unchecked below.
        assert!((r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let (low, three, ones) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30), _mm256_set1_epi16(1));
        let mut acc = [[_mm256_setzero_ps(); H]; R];
        for s in 0..nsb {
            let blk = w.as_ptr().add(s * bytes);
            let mut sums = [[_mm256_setzero_ps(); H]; R];
            for chunk in 0..8 {
                if first == 0 {
                    prefetch_eighth(blk, bytes, chunk);
                }
                let a: [*const i32; R] =
                    std::array::from_fn(|r| act.qs.as_ptr().add((r0 + r) * k + s * QK_K + 32 * chunk) as *const i32);
                // Sub-block `sub` of 16 columns: the low nibbles of the 4 vectors hold columns 0..16 (`sub` 0),
                // the high nibbles 16..32; the fifth and sixth bits are in `Q6K_HIGH`.
                for sub in 0..2 {
                    for h in 0..H {
                        let half = first + h;
                        let high =
                            _mm256_loadu_si256(blk.add(Q6K_HIGH + chunk * 128 + 64 * sub + 32 * half) as *const _);
                        let ints: [__m256i; 4] = std::array::from_fn(|c| {
                            let v = packed(blk, chunk, c, half);
                            let nib = if sub == 0 { v } else { _mm256_srli_epi16(v, 4) };
                            // Bits 2c..2c+2 of `high`, moved to bits 4..6.
                            let fifth = match c {
                                0 => _mm256_slli_epi16(high, 4),
                                1 => _mm256_slli_epi16(high, 2),
                                2 => high,
                                _ => _mm256_srli_epi16(high, 2),
                            };
                            _mm256_or_si256(_mm256_and_si256(nib, low), _mm256_and_si256(fifth, three))
                        });
                        let sc = scales(blk.add(Q6K_SCALES + 16 * (2 * chunk + sub) + 8 * half), true);
                        for (r, sum) in sums.iter_mut().enumerate() {
                            let y = |c: usize| four(a[r], 4 * sub + c);
                            let p01 = _mm256_add_epi16(
                                _mm256_maddubs_epi16(ints[0], y(0)),
                                _mm256_maddubs_epi16(ints[1], y(1)),
                            );
                            let p23 = _mm256_add_epi16(
                                _mm256_maddubs_epi16(ints[2], y(2)),
                                _mm256_maddubs_epi16(ints[3], y(3)),
                            );
                            let s16 = ((r0 + r) * nsb + s) * 16 + 2 * chunk + sub;
                            let dot = _mm256_add_epi32(
                                _mm256_set1_epi32(-32 * act.sum16[s16]),
                                _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)),
                            );
                            sum[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), sc, sum[h]);
                        }
                    }
                }
            }
            for h in 0..H {
                let d = halfs(blk.add(Q6K_D + 16 * (first + h)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let da = _mm256_set1_ps(act.d[(r0 + r) * nsb + s]);
                    acc[h] = _mm256_fmadd_ps(sums[r][h], _mm256_mul_ps(d, da), acc[h]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (h, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * stride + 8 * (first + h)), *acc);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::kernels::quant::blocks32::tests::{assert_matches_candle, input};

    fn weights(kind: GgmlDType, n: usize, k: usize) -> QTensor {
        let vals: Vec<f32> =
            (0..n * k).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * (1.0 + (i / 64 % 7) as f32)).collect();
        QTensor::quantize(&Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap(), kind).unwrap()
    }

    /// The vectorized activation quantization gives the scalar one's bits (halves included) and candle's.
    #[test]
    fn simd_quantization_matches_scalar_and_candle() {
        use candle_core::quantized::k_quants::{BlockQ8K, GgmlType};
        if Isa::detect() != Isa::Avx512Vnni {
            return;
        }
        let mut blocks: Vec<Vec<f32>> =
            (0..50).map(|b| input(1, QK_K).iter().map(|v| v * (b as f32 - 25.0)).collect()).collect();
        // Exact halves after scaling by −127/max (max = −127): 0.5, 1.5, ... and their negatives.
        blocks.push((0..QK_K).map(|i| if i == 0 { -127.0 } else { (i as f32 - 128.0) + 0.5 }).collect());
        blocks.push(vec![0.0; QK_K]);
        for x in blocks {
            let (mut a, mut b) = ([0i8; QK_K], [0i8; QK_K]);
            let scalar = quantize_superblock_portable(&x, &mut a);
            // SAFETY: AVX-512 was detected.
            let simd = unsafe { avx512::quantize_superblock(&x, &mut b) };
            assert_eq!((scalar, a), (simd, b), "block {x:?}");
            let mut reference = [BlockQ8K::zeros()];
            BlockQ8K::from_float(&x, &mut reference);
            let mut dequantized = [0f32; QK_K];
            BlockQ8K::to_float(&reference, &mut dequantized);
            let ours: Vec<f32> = a.iter().map(|&q| scalar.0 * q as f32).collect();
            assert_eq!(ours, dequantized);
        }
    }

    /// Unpacking each row's super-blocks gives candle's dequantized weights.
    #[test]
    fn unpack_matches_candle_dequantization() {
        for kind in [GgmlDType::Q4K, GgmlDType::Q6K] {
            let q = weights(kind, 3, 512);
            let reference = q.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let kk = KKind::of(kind).unwrap();
            let data = q.data().unwrap();
            for (b, block) in data.chunks_exact(kk.block_bytes()).enumerate() {
                let u = unpack(kk, block);
                for e in 0..QK_K {
                    let v = match kk {
                        KKind::Q4K => u.d * u.scales[e / 32] as f32 * u.q[e] as f32 - u.dmin * u.mins[e / 32] as f32,
                        KKind::Q6K => u.d * u.scales[e / 16] as f32 * (u.q[e] as f32 - 32.0),
                    };
                    let r = reference[b * QK_K + e];
                    assert!((v - r).abs() <= 1e-5 * (1.0 + r.abs()), "{kind:?} block {b} [{e}]: {v} vs {r}");
                }
            }
        }
    }

    /// Against candle's kernels, which quantize activations the same way (Q8_K); 70 weight rows is not a
    /// multiple of the group, so the padding is covered, and 6 activation rows take two tiles.
    #[test]
    fn matches_candle_kernel() {
        for isa in Isa::simd_here() {
            for kind in [GgmlDType::Q4K, GgmlDType::Q6K] {
                let (n, k, m) = (70, 512, 6);
                let q = weights(kind, n, k);
                let sb = SuperBlockMatrix::from_qtensor_on(&q, isa).unwrap().unwrap();
                let x = input(m, k);
                let y = sb.matmul(&x, m);
                assert_matches_candle(q, &x, m, &y, &format!("{kind:?} on {isa:?}"));
            }
        }
    }

    /// One output element as every kernel computes it, written out in scalar code from the file's blocks
    /// (unpacked) and the portable Q8_K activations: integer dot products per sub-block, then the same fused
    /// float steps in the same order. Each instruction set must give these bits.
    fn reference(kind: KKind, row: &[u8], act: &Q8KRows, r: usize) -> f32 {
        let nsb = row.len() / kind.block_bytes();
        let k = nsb * QK_K;
        let mut acc = 0f32;
        for (s, block) in row.chunks_exact(kind.block_bytes()).enumerate() {
            let u = unpack(kind, block);
            let a = &act.qs[r * k + s * QK_K..][..QK_K];
            let da = act.d[r * nsb + s];
            let dot =
                |from: usize, len: usize| -> i32 { (from..from + len).map(|e| u.q[e] as i32 * a[e] as i32).sum() };
            let mut sum = 0f32;
            match kind {
                KKind::Q4K => {
                    let mut msum = 0i32;
                    for j in 0..8 {
                        sum = (dot(32 * j, 32) as f32).mul_add(u.scales[j] as f32, sum);
                        let sum32: i32 = a[32 * j..32 * (j + 1)].iter().map(|&q| q as i32).sum();
                        msum += u.mins[j] as i32 * sum32;
                    }
                    acc = sum.mul_add(u.d * da, acc);
                    acc = (-(msum as f32)).mul_add(u.dmin * da, acc);
                }
                KKind::Q6K => {
                    for j in 0..16 {
                        let d = dot(16 * j, 16) - 32 * act.sum16[(r * nsb + s) * 16 + j];
                        sum = (d as f32).mul_add(u.scales[j] as f32, sum);
                    }
                    acc = sum.mul_add(u.d * da, acc);
                }
            }
        }
        acc
    }

    /// Every instruction set this CPU runs gives each output the reference's bits, for 1 to 8 activation rows
    /// (AVX2 tiles of 4 and the rest) and a weight whose rows are not a multiple of the group: an AVX-512 and
    /// an AVX2 machine decode the same text.
    #[test]
    fn every_isa_gives_the_reference_bits() {
        let isas = Isa::simd_here();
        assert!(!isas.is_empty() || !Isa::detect().is_simd(), "detection and the list of instruction sets agree");
        for isa in isas {
            for kind in [GgmlDType::Q4K, GgmlDType::Q6K] {
                let (n, k) = (40, 3 * QK_K);
                let q = weights(kind, n, k);
                let kk = KKind::of(kind).unwrap();
                let data = q.data().unwrap();
                let sb = SuperBlockMatrix::from_qtensor_on(&q, isa).unwrap().unwrap();
                for m in [1, 3, 4, 5, 8] {
                    let x = input(m, k);
                    let act = Q8KRows::quantize(&x, m, k, Isa::Avx2);
                    let y = sb.matmul(&x, m);
                    for r in 0..m {
                        for (i, row) in data.chunks_exact(data.len() / n).enumerate() {
                            let expected = reference(kk, row, &act, r);
                            assert_eq!(
                                y[r * n + i].to_bits(),
                                expected.to_bits(),
                                "{kind:?} on {isa:?}, {m} rows: [{r}, {i}] {} vs {expected}",
                                y[r * n + i]
                            );
                        }
                    }
                }
            }
        }
    }

    /// Q4_K and Q6_K weights share one Q8_K quantization: each shared product, and the gated one, gives the
    /// bits of the separate products (followed by `silu_mul`); a 32-element block type is refused.
    #[test]
    fn shared_products_match_their_own() {
        use crate::kernels::quant::{blocks32::BlockMatrix, matmul_shared, matmul_silu_gated};
        for isa in Isa::simd_here() {
            let k = 512;
            let matrix = |kind, n| SuperBlockMatrix::from_qtensor_on(&weights(kind, n, k), isa).unwrap().unwrap();
            let (q4, q6, up) = (matrix(GgmlDType::Q4K, 48), matrix(GgmlDType::Q6K, 70), matrix(GgmlDType::Q6K, 48));
            for m in [1, 5, 8, 11] {
                let x = input(m, k);
                let shared = matmul_shared(&[&q4, &q6], &x, m, k).unwrap();
                assert_eq!(shared, [q4.matmul(&x, m), q6.matmul(&x, m)], "{m} rows");
                let mut expected = up.matmul(&x, m);
                crate::kernels::activations::silu_mul(&q4.matmul(&x, m), &mut expected);
                assert_eq!(matmul_silu_gated(&q4, &up, &x, m, k).unwrap(), expected, "gated, {m} rows");
            }
            let q8 = BlockMatrix::from_qtensor(&weights(GgmlDType::Q8_0, 16, k)).unwrap().unwrap();
            assert!(matmul_shared(&[&q4, &q8], &input(1, k), 1, k).is_none());
        }
    }

    /// Rows computed through AMX tiles (16 at a time) are bit for bit the same rows computed alone through
    /// VNNI, for both types, alone, shared and gated (a Q4_K gate with a Q6_K up, which share activations);
    /// 37 rows leave 5 rows to VNNI in the same product.
    #[test]
    fn tile_rows_match_vnni_rows() {
        use crate::kernels::quant::{matmul_shared, matmul_silu_gated};
        use std::sync::atomic::Ordering;
        if Isa::detect() != Isa::Avx512Vnni {
            return;
        }
        let tiles = crate::kernels::amx::tested_here("tile_rows_match_vnni_rows (K types)");
        let before = crate::kernels::amx::PRODUCTS.load(Ordering::Relaxed);
        let (n, k, m) = (70, 3 * QK_K, 37);
        let x = input(m, k);
        let q4 = SuperBlockMatrix::from_qtensor(&weights(GgmlDType::Q4K, n, k)).unwrap().unwrap();
        let q6 = SuperBlockMatrix::from_qtensor(&weights(GgmlDType::Q6K, n, k)).unwrap().unwrap();
        let (y4, y6) = (q4.matmul(&x, m), q6.matmul(&x, m));
        for r in 0..m {
            let row = &x[r * k..(r + 1) * k];
            assert_eq!(&y4[r * n..(r + 1) * n], &q4.matmul(row, 1)[..], "Q4_K row {r}");
            assert_eq!(&y6[r * n..(r + 1) * n], &q6.matmul(row, 1)[..], "Q6_K row {r}");
        }
        assert_eq!(matmul_shared(&[&q4, &q6], &x, m, k).unwrap(), [y4.clone(), y6.clone()], "shared");
        let gate = SuperBlockMatrix::from_qtensor(&weights(GgmlDType::Q4K, 64, k)).unwrap().unwrap();
        let up = SuperBlockMatrix::from_qtensor(&weights(GgmlDType::Q6K, 64, k)).unwrap().unwrap();
        let mut expected = up.matmul(&x, m);
        crate::kernels::activations::silu_mul(&gate.matmul(&x, m), &mut expected);
        assert_eq!(matmul_silu_gated(&gate, &up, &x, m, k).unwrap(), expected, "gated");
        if tiles {
            assert!(crate::kernels::amx::PRODUCTS.load(Ordering::Relaxed) > before, "no tile product ran");
        }
    }

    /// A row's result does not depend on the other rows in the block.
    #[test]
    fn rows_are_independent() {
        for (isa, kind) in Isa::simd_here().into_iter().flat_map(|isa| [(isa, GgmlDType::Q4K), (isa, GgmlDType::Q6K)]) {
            let (n, k, m) = (40, 768, 7);
            let sb = SuperBlockMatrix::from_qtensor_on(&weights(kind, n, k), isa).unwrap().unwrap();
            let x = input(m, k);
            let block = sb.matmul(&x, m);
            for r in 0..m {
                assert_eq!(
                    sb.matmul(&x[r * k..(r + 1) * k], 1),
                    block[r * n..(r + 1) * n],
                    "{kind:?} on {isa:?}, row {r}"
                );
            }
        }
    }
}
