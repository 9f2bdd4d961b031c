//! Matrix products for the 32-element GGUF block types: Q4_1 (SmolLM2's Q4_1 file) and Q5_0 (most of
//! Qwen2.5-Coder-0.5B and Gemma 3 270M), for which candle 0.11 has only scalar dot products on x86
//! (`vec_dot_unopt`, most of a forward), and Q4_0 and Q8_0 too (candle's Q8_0 falls well short of memory
//! speed).
//!
//! Activations are quantized per 32-element block to 8 bits (llama.cpp's Q8_1: scale, integer sum). Each
//! output element is computed by the same arithmetic whatever the number of rows: a token verified in a block
//! gets bit-identical logits to the same token decoded alone.
//!
//! Two layouts:
//! - [`Layout::Interleaved`] (AVX-512 VNNI, and AVX2): at load, the weights are regrouped by 16 rows so that
//!   one `vpdpbusd` multiplies 4 weights of each of 16 rows by the same 4 activations: a block of 16 rows × 32
//!   weights costs 8 multiply-adds and no horizontal sums, and the 16 results land in one register. AVX2
//!   reads the same layout 8 rows at a time (`vpmaddubsw`, `vpmaddwd`), with the same integer sums and the
//!   same float steps, so the same bits. Stored bytes are the same as the file's, so the product runs at
//!   memory speed.
//! - [`Layout::Rows`] (scalar machines, and the tests): the file's row-major blocks; every weight row is read once for the
//!   rows of a block of tokens and each weight block is unpacked once for four of them.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;

use super::{
    over_groups, regroup, rows_of, ActFormat, AmxTile, GroupTiles, QuantKernel, RowReader, SharedActivations,
    SharedKernel, AVX2_TILE, GROUP, GROUP_TILE,
};
use crate::error::{Error, Result};
use crate::kernels::cpu::Isa;
use crate::kernels::parallel::{for_each_chunk, SharedOut};

const QK: usize = 32;

/// The weight types with a kernel here. Each is held as unsigned integers `q` with a value `d·(q − offset)`
/// (+ `m` for Q4_1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `d: f16, qs: [u8; 16]`, value `d·(q − 8)`, q in 0..16.
    Q4_0,
    /// `d: f16, m: f16, qs: [u8; 16]`, value `d·q + m`, q in 0..16.
    Q4_1,
    /// `d: f16, qh: [u8; 4], qs: [u8; 16]`, value `d·(q − 16)`, q in 0..32 (fifth bit in `qh`).
    Q5_0,
    /// `d: f16, qs: [i8; 32]`, value `d·qs`; held as `q = qs + 128`.
    Q8_0,
}

impl BlockKind {
    fn of(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_0 => Some(BlockKind::Q4_0),
            GgmlDType::Q4_1 => Some(BlockKind::Q4_1),
            GgmlDType::Q5_0 => Some(BlockKind::Q5_0),
            GgmlDType::Q8_0 => Some(BlockKind::Q8_0),
            _ => None,
        }
    }

    fn block_bytes(self) -> usize {
        match self {
            BlockKind::Q4_0 => 18,
            BlockKind::Q4_1 => 20,
            BlockKind::Q5_0 => 22,
            BlockKind::Q8_0 => 34,
        }
    }

    /// The integer subtracted from each held `q`.
    fn offset(self) -> i32 {
        match self {
            BlockKind::Q4_0 => 8,
            BlockKind::Q4_1 => 0,
            BlockKind::Q5_0 => 16,
            BlockKind::Q8_0 => 128,
        }
    }
}

/// How a [`BlockMatrix`] holds its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The file's layout: row after row of blocks.
    Rows,
    /// Groups of [`GROUP`] rows; within a group, block after block, each as 16 rows' integers arranged for
    /// `vpdpbusd`, then (Q5_0) their fifth bits, then 16 f16 scales, then (Q4_1) 16 f16 minimums.
    Interleaved,
}

/// A quantized weight `[n, k]` of 32-element blocks.
#[derive(Debug)]
pub struct BlockMatrix {
    kind: BlockKind,
    layout: Layout,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// One quantized activation block as llama.cpp's Q8_1 stores it: the integers, the scale and the scaled sum
/// (both rounded through f16, as ggml and candle do), and the integer sum.
#[derive(Clone, Copy)]
#[repr(C)]
struct Q8Block {
    qs: [i8; QK],
    d: f32,
    /// `d · Σ qs`.
    s: f32,
    isum: i32,
}

impl QuantKernel for BlockMatrix {
    fn out_features(&self) -> usize {
        self.n
    }

    fn dtype(&self) -> GgmlDType {
        match self.kind {
            BlockKind::Q4_0 => GgmlDType::Q4_0,
            BlockKind::Q4_1 => GgmlDType::Q4_1,
            BlockKind::Q5_0 => GgmlDType::Q5_0,
            BlockKind::Q8_0 => GgmlDType::Q8_0,
        }
    }

    fn matmul_first(&self, x: &[f32], m: usize, n: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), m * self.k);
        let n = n.min(self.n);
        match self.layout {
            Layout::Rows => self.matmul_rows(x, m, n),
            #[cfg(target_arch = "x86_64")]
            Layout::Interleaved => self.matmul_interleaved(x, m, n),
            #[cfg(not(target_arch = "x86_64"))]
            Layout::Interleaved => unreachable!("the interleaved layout is only built where AVX2 was detected"),
        }
    }

    fn shared(&self) -> Option<&dyn SharedKernel> {
        (cfg!(target_arch = "x86_64") && self.layout == Layout::Interleaved).then_some(self as &dyn SharedKernel)
    }
}

impl SharedKernel for BlockMatrix {
    fn format(&self) -> ActFormat {
        ActFormat::Blocks { k: self.k, offset: self.kind.offset() }
    }

    fn quantize(&self, x: &[f32], m: usize) -> SharedActivations {
        SharedActivations::Blocks(Q8Rows::quantize(x, m, self.k, self.kind.offset()))
    }

    fn group_tiles<'a>(&'a self, act: &'a SharedActivations) -> GroupTiles<'a> {
        #[allow(irrefutable_let_patterns)] // a single variant where there are no K-type kernels
        let SharedActivations::Blocks(act) = act
        else {
            unreachable!("activations of another format")
        };
        // The tile is the AVX-512 or the AVX2 kernel over interleaved groups.
        assert_eq!(self.layout, Layout::Interleaved, "group tiles of a {:?} {:?} weight", self.layout, self.kind);
        let (kind, nb) = (self.kind, self.k / QK);
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() == Isa::Avx2 {
            return GroupTiles {
                data: &self.data,
                n: self.n,
                group_bytes: nb * GROUP * kind.block_bytes(),
                rows: AVX2_TILE,
                amx: None,
                tile: Box::new(move |w, r0, rows, at, stride| {
                    // SAFETY: the interleaved layout is only built where AVX2, FMA and F16C were detected; `w` is
                    // one group, `nb` group-blocks of `kind`; the tile checks the activation rows; `run`'s caller
                    // vouches for `rows` (at most `AVX2_TILE`), `at` and `stride`.
                    unsafe { avx2::tile_fn(kind, rows)(w, nb, act, r0, at, stride) }
                }),
            };
        }
        GroupTiles {
            data: &self.data,
            n: self.n,
            group_bytes: nb * GROUP * kind.block_bytes(),
            rows: GROUP_TILE,
            amx: self.amx_tile(act),
            tile: Box::new(move |w, r0, rows, at, stride| {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the interleaved layout is built where AVX-512 F, BW, VNNI and F16C were detected, or
                // AVX2 (taken above); `w` is one group, `nb` group-blocks of `kind` (`GroupTiles::run` slices it);
                // the tile checks the activation rows; `run`'s caller vouches for `rows`, `at` and `stride`.
                unsafe {
                    avx512::tile_fn(kind, rows)(w, nb, act, r0, at, stride)
                }
                #[cfg(not(target_arch = "x86_64"))]
                unreachable!("{:?}", (w, r0, rows, at, stride, act.d.len()))
            }),
        }
    }
}

impl BlockMatrix {
    /// The AMX side of [`SharedKernel::group_tiles`] where tiles are available, for the types they make faster:
    /// not Q4_1, whose minimum term adds a multiply-add per row and block to the scaling after each tile and
    /// whose product measured slower through tiles than through VNNI (BENCHMARKS.md).
    fn amx_tile<'a>(&'a self, act: &'a Q8Rows) -> Option<AmxTile<'a>> {
        let kind = self.kind;
        if !crate::kernels::cpu::features().amx_int8 || kind == BlockKind::Q4_1 {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        return Some(AmxTile {
            unpacked_bytes: self.k / QK * 512,
            // SAFETY: AVX-512 F and BW were detected (tiles are only granted beside AVX-512 VNNI).
            unpack: Box::new(move |w, out| unsafe { avx512::unpack_signed(kind, w, out) }),
            // SAFETY: AVX-512 F, BW and F16C were detected; `run_rows` passes a group and its unpacked integers,
            // and its caller vouches for `at` and `stride` and the tiles of this thread.
            tile: Box::new(move |tiles, ints, r0, at, stride| unsafe {
                avx512::amx_tile(kind, tiles, ints, act, r0, (at, stride))
            }),
        });
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("tiles are granted only on x86-64 ({kind:?}, {})", act.d.len())
    }

    /// `Some` for the block types this machine has a kernel for, in the fastest layout it can run.
    pub fn from_qtensor(q: &QTensor) -> Result<Option<Self>> {
        let layout = if Isa::detect().is_simd() { Layout::Interleaved } else { Layout::Rows };
        Self::with_layout(q, layout)
    }

    /// `Some` for the block types `layout` has a kernel for on this machine (the row layout: all four, with AVX2
    /// or without).
    pub fn with_layout(q: &QTensor, layout: Layout) -> Result<Option<Self>> {
        let Some(kind) = BlockKind::of(q.dtype()) else { return Ok(None) };
        let (n, k) = q.shape().dims2()?;
        let runnable = match layout {
            Layout::Rows => true,
            Layout::Interleaved => Isa::detect().is_simd(),
        };
        if k % QK != 0 || !runnable {
            return Ok(None);
        }
        let data = q.data()?;
        let expected = n * (k / QK) * kind.block_bytes();
        if data.len() != expected {
            return Err(Error::ShapeMismatch {
                name: format!("{kind:?} block data of a [{n}, {k}] tensor (bytes)"),
                expected: vec![expected],
                actual: vec![data.len()],
            });
        }
        let data = match layout {
            Layout::Rows => data.into_owned(),
            Layout::Interleaved => interleave(kind, n, k, &mut rows_of(&data, expected / n.max(1)))?,
        };
        Ok(Some(Self { kind, layout, n, k, data }))
    }

    /// `Some` where [`Self::from_qtensor`] would take the interleaved layout, built from the stored rows 16 at
    /// a time: the tensor is never held twice while it is regrouped.
    pub fn from_stored(dtype: GgmlDType, n: usize, k: usize, read: &mut RowReader) -> Result<Option<Self>> {
        let Some(kind) = BlockKind::of(dtype) else { return Ok(None) };
        if !k.is_multiple_of(QK) || !Isa::detect().is_simd() {
            return Ok(None);
        }
        let data = interleave(kind, n, k, read)?;
        Ok(Some(Self { kind, layout: Layout::Interleaved, n, k, data }))
    }

    /// `x`: `[m, k]` row-major → `[m, n]`.
    #[cfg(test)]
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_first(x, m, self.n)
    }

    fn matmul_interleaved(&self, x: &[f32], m: usize, n: usize) -> Vec<f32> {
        let act = SharedKernel::quantize(self, x, m);
        let part = GroupTiles { n, ..self.group_tiles(&act) };
        over_groups(part, m)
    }

    fn matmul_rows(&self, x: &[f32], m: usize, n: usize) -> Vec<f32> {
        let k = self.k;
        let nb = k / QK;
        let act: Vec<Q8Block> = x.chunks_exact(QK).map(quantize_block).collect();
        let row_bytes = nb * self.kind.block_bytes();
        // `[n, m]`: each weight row gives its m outputs together; transposed at the end.
        let mut out_t = vec![0f32; n * m];
        let dst = SharedOut::new(&mut out_t);
        for_each_chunk(n, |range| {
            // SAFETY: the chunks of weight rows are disjoint, and so are their outputs.
            let chunk = unsafe { dst.slice(range.start * m, range.len() * m) };
            for (i, outs) in chunk.chunks_mut(m).enumerate() {
                let row = range.start + i;
                let w = &self.data[row * row_bytes..(row + 1) * row_bytes];
                for (r, o) in outs.iter_mut().enumerate() {
                    *o = dot_scalar(self.kind, w, &act[r * nb..(r + 1) * nb]);
                }
            }
        });
        if m == 1 {
            return out_t;
        }
        let mut out = vec![0f32; m * n];
        for (j, outs) in out_t.chunks_exact(m).enumerate() {
            for (r, v) in outs.iter().enumerate() {
                out[r * n + j] = *v;
            }
        }
        out
    }
}

/// Regroups the file's row-major blocks `[n, k / 32]` into [`Layout::Interleaved`]; rows past `n` (up to a
/// multiple of 16) are zero blocks, whose scale 0 makes their products 0.
fn interleave(kind: BlockKind, n: usize, k: usize, read: &mut RowReader) -> Result<Vec<u8>> {
    let nb = k / QK;
    let bytes = kind.block_bytes();
    let quant_bytes = group_quant_bytes(kind);
    regroup(n, nb * bytes, nb * GROUP * bytes, read, |rows, group| {
        for (i, row) in rows.chunks_exact(nb * bytes).enumerate() {
            for (src, dst) in row.chunks_exact(bytes).zip(group.chunks_exact_mut(GROUP * bytes)) {
                let (q, _, _) = unpack_scalar(kind, src);
                for c in 0..4 {
                    for j in 0..4 {
                        let (lo, hi) = (q[4 * c + j], q[16 + 4 * c + j]);
                        let at = c * 64 + 4 * i + j;
                        if kind == BlockKind::Q8_0 {
                            dst[at] = lo;
                            dst[at + 256] = hi;
                        } else {
                            // Chunk c in the low nibbles, chunk c + 4 in the high nibbles, of the same bytes.
                            dst[at] = (lo & 0x0F) | ((hi & 0x0F) << 4);
                        }
                    }
                }
                if kind == BlockKind::Q5_0 {
                    for (e, v) in q.iter().enumerate() {
                        let bit = 4 * i + e % 4;
                        dst[256 + e / 4 * 8 + bit / 8] |= ((v >> 4) & 1) << (bit % 8);
                    }
                }
                dst[quant_bytes + 2 * i..][..2].copy_from_slice(&src[..2]);
                if kind == BlockKind::Q4_1 {
                    dst[quant_bytes + 32 + 2 * i..][..2].copy_from_slice(&src[2..4]);
                }
            }
        }
    })
}

/// Bytes before the scales in an interleaved group-block: the integers and, for Q5_0, the fifth bits.
fn group_quant_bytes(kind: BlockKind) -> usize {
    match kind {
        BlockKind::Q8_0 => 512,
        BlockKind::Q5_0 => 256 + 64,
        BlockKind::Q4_0 | BlockKind::Q4_1 => 256,
    }
}

/// `m` activation rows quantized per block for the interleaved kernel: the integers row-major `[m, k]`, and
/// per block `[m, k / 32]` the scale, `offset · Σq` (subtracted from the integer dot product), and `d · Σq`.
pub struct Q8Rows {
    qs: Vec<i8>,
    d: Vec<f32>,
    correction: Vec<i32>,
    s: Vec<f32>,
}

impl Q8Rows {
    fn quantize(x: &[f32], m: usize, k: usize, offset: i32) -> Self {
        let blocks = m * (k / QK);
        let (qs, d, s) = (vec![0; m * k], vec![0.0; blocks], vec![0.0; blocks]);
        let mut rows = Q8Rows { qs, d, correction: vec![0; blocks], s };
        // The blocks of all rows are consecutive in `x`: sixteen at a time, then one at a time, with AVX-512
        // where it was detected (the same bits as the scalar code, which AVX2 machines run).
        #[cfg(target_arch = "x86_64")]
        let simd = Isa::detect() == Isa::Avx512Vnni;
        #[cfg(target_arch = "x86_64")]
        let batched = if simd { blocks / 16 * 16 } else { 0 };
        #[cfg(target_arch = "x86_64")]
        for b in (0..batched).step_by(16) {
            // SAFETY: AVX-512 F, BW and F16C were detected (`batched` is 0 otherwise); the function checks that
            // the slices hold 16 blocks.
            unsafe {
                avx512::quantize_16_blocks(
                    &x[b * QK..][..16 * QK],
                    &mut rows.qs[b * QK..][..16 * QK],
                    &mut rows.d[b..][..16],
                    &mut rows.s[b..][..16],
                    &mut rows.correction[b..][..16],
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let batched = 0;
        for b in batched..blocks {
            let (src, dst) = (&x[b * QK..][..QK], &mut rows.qs[b * QK..][..QK]);
            #[cfg(target_arch = "x86_64")]
            let (d, s, isum) = if simd {
                // SAFETY: AVX-512 F, BW and F16C were detected; both slices hold one block.
                unsafe { avx512::quantize_block(src, dst) }
            } else {
                quantize_block_scalar(src, dst)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let (d, s, isum) = quantize_block_scalar(src, dst);
            (rows.d[b], rows.s[b], rows.correction[b]) = (d, s, isum);
        }
        if offset != 0 {
            rows.correction.iter_mut().for_each(|c| *c *= offset);
        }
        rows
    }
}

/// Rounding to the nearest integer, ties to even, for |v| ≤ 127.5: adding and subtracting 1.5·2²³ (as
/// llama.cpp's SIMD code rounds), so that it vectorizes instead of calling `roundf`.
const ROUND: f32 = 12_582_912.0;

/// llama.cpp's `quantize_row_q8_1` for one block (its SIMD rounding, ties to even) into `qs`: returns the scale
/// and `d · Σq` (both rounded through f16, as stored) and `Σq`.
fn quantize_block_scalar(x: &[f32], qs: &mut [i8]) -> (f32, f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut isum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        *q = ((v * id + ROUND) - ROUND) as i8;
        isum += *q as i32;
    }
    let round = |v: f32| f16::from_f32(v).to_f32();
    (round(d), round(d * isum as f32), isum)
}

fn quantize_block(x: &[f32]) -> Q8Block {
    let mut qs = [0i8; QK];
    let (d, s, isum) = quantize_block_scalar(x, &mut qs);
    Q8Block { qs, d, s, isum }
}

/// The weight block's held integers (see [`BlockKind`]), its scale, and its offset: `m` (Q4_1), else
/// `−offset·d`.
fn unpack_scalar(kind: BlockKind, b: &[u8]) -> ([u8; QK], f32, f32) {
    let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
    let mut q = [0u8; QK];
    let nibbles = |q: &mut [u8; QK], qs: &[u8]| {
        for j in 0..16 {
            q[j] = qs[j] & 0x0F;
            q[j + 16] = qs[j] >> 4;
        }
    };
    match kind {
        BlockKind::Q4_0 => {
            nibbles(&mut q, &b[2..18]);
            (q, d, -8.0 * d)
        }
        BlockKind::Q8_0 => {
            for (q, &v) in q.iter_mut().zip(&b[2..34]) {
                *q = (v as i8 as i32 + 128) as u8;
            }
            (q, d, -128.0 * d)
        }
        BlockKind::Q4_1 => {
            nibbles(&mut q, &b[4..20]);
            (q, d, f16::from_le_bytes([b[2], b[3]]).to_f32())
        }
        BlockKind::Q5_0 => {
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            for j in 0..16 {
                q[j] = (b[6 + j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
                q[j + 16] = (b[6 + j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            }
            (q, d, -16.0 * d)
        }
    }
}

fn dot_scalar(kind: BlockKind, w: &[u8], act: &[Q8Block]) -> f32 {
    let bytes = kind.block_bytes();
    let mut sum = 0f32;
    for (b, a) in w.chunks_exact(bytes).zip(act) {
        let (q, d, offset) = unpack_scalar(kind, b);
        let isum: i32 = q.iter().zip(&a.qs).map(|(&x, &y)| x as i32 * y as i32).sum();
        sum += d * a.d * isum as f32 + offset_term(kind, offset, a);
    }
    sum
}

/// The weight offset times the activation sum: `m · s` for Q4_1 (as ggml), `−offset·d_w · d_a · Σq` otherwise.
#[inline]
fn offset_term(kind: BlockKind, offset: f32, a: &Q8Block) -> f32 {
    match kind {
        BlockKind::Q4_1 => offset * a.s,
        _ => offset * a.d * a.isum as f32,
    }
}

/// The block types in the order of the tiles' `K` parameter (a constant, so that each type's branches fold
/// away from the inner loops).
#[cfg(target_arch = "x86_64")]
const KINDS: [BlockKind; 4] = [BlockKind::Q4_0, BlockKind::Q4_1, BlockKind::Q5_0, BlockKind::Q8_0];

/// Prefetches the group-block `PREFETCH_BLOCKS` ahead of the one at `blk` (`block_bytes` each), for the VNNI and
/// the AVX2 tiles: with the hardware prefetcher alone a one-token forward waits on memory.
#[cfg(target_arch = "x86_64")]
#[inline]
fn prefetch_ahead(blk: *const u8, block_bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    const PREFETCH_BLOCKS: usize = 8;
    let ahead = blk.wrapping_add(PREFETCH_BLOCKS * block_bytes);
    for line in (0..block_bytes).step_by(64) {
        // SAFETY: SSE is part of x86-64; a prefetch past the end of the weights never faults (the address is
        // formed with wrapping arithmetic).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{group_quant_bytes, prefetch_ahead, BlockKind, Q8Rows, AVX2_TILE, GROUP, KINDS, QK};

    /// A [`group_tile`] instance for one weight type and row count `R`: `tile(w, nb, act, r0, out, stride)`.
    ///
    /// Calling one is safe when the CPU supports AVX2, FMA and F16C; `w` holds `nb` interleaved group-blocks
    /// of the instance's type (they are read unchecked); and `out` is valid for writes of
    /// `out[r · stride .. r · stride + 16]` for each `r < R`, elements no other thread accesses meanwhile. The
    /// activation rows `r0..r0 + R` are checked against `act`.
    pub type TileFn = unsafe fn(&[u8], usize, &Q8Rows, usize, *mut f32, usize);

    /// The instance compiled for `kind` and `rows` (1 to [`AVX2_TILE`]).
    pub fn tile_fn(kind: BlockKind, rows: usize) -> TileFn {
        macro_rules! rows {
            ($k:literal) => {
                match rows {
                    1 => group_tile::<1, $k>,
                    2 => group_tile::<2, $k>,
                    3 => group_tile::<3, $k>,
                    _ => group_tile::<AVX2_TILE, $k>,
                }
            };
        }
        match kind {
            BlockKind::Q4_0 => rows!(0),
            BlockKind::Q4_1 => rows!(1),
            BlockKind::Q5_0 => rows!(2),
            BlockKind::Q8_0 => rows!(3),
        }
    }

    /// The held integers of half `half` (rows `8 · half ..`) of the group-block at `blk`: vector c holds
    /// elements 4c..4c + 4 of the 8 rows. Q8_0's are returned signed (`q − 128`, the stored `qs`), for the
    /// sign trick of [`group_halves`]; the others unsigned.
    ///
    /// # Safety
    /// The CPU supports AVX2; `half < 2` and `blk` is valid for reads of one group-block of `kind`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn half_ints(kind: BlockKind, blk: *const u8, half: usize) -> [__m256i; 8] {
        let load = |at: usize| _mm256_loadu_si256(blk.add(at + 32 * half) as *const __m256i);
        let mut wq = [_mm256_setzero_si256(); 8];
        if kind == BlockKind::Q8_0 {
            for (c, v) in wq.iter_mut().enumerate() {
                *v = _mm256_xor_si256(load(64 * c), _mm256_set1_epi8(i8::MIN));
            }
            return wq;
        }
        let low = _mm256_set1_epi8(0x0F);
        for c in 0..4 {
            let v = load(64 * c);
            wq[c] = _mm256_and_si256(v, low);
            wq[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        if kind == BlockKind::Q5_0 {
            let fifth = _mm256_set1_epi8(0x10);
            for (c, v) in wq.iter_mut().enumerate() {
                let bits = (blk.add(256 + 8 * c + 4 * half) as *const u32).read_unaligned();
                *v = _mm256_or_si256(*v, _mm256_and_si256(bytes_from_bits(bits), fifth));
            }
        }
        wq
    }

    /// `R` activation rows (from `r0`) against one interleaved group of 16 weight rows (`w`: `nb` group-blocks):
    /// writes `out[r · stride .. r · stride + 16]` for each. Up to two rows take both halves of each vector at
    /// once (each cache line read once); more rows take one half at a time.
    ///
    /// # Safety
    /// As for a [`TileFn`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group_tile<const R: usize, const K: usize>(
        w: &[u8],
        nb: usize,
        act: &Q8Rows,
        r0: usize,
        out: *mut f32,
        stride: usize,
    ) {
        if R <= 2 {
            group_halves::<R, K, 2>(w, nb, act, r0, (out, stride), 0);
        } else {
            group_halves::<R, K, 1>(w, nb, act, r0, (out, stride), 0);
            group_halves::<R, K, 1>(w, nb, act, r0, (out, stride), 1);
        }
    }

    /// [`group_tile`] for the `H` halves of 8 weight rows from half `first`. Per row and block the integer dot
    /// product is the AVX-512 tile's (`vpmaddubsw` pairs summed in i16 while they cannot overflow: eight for the
    /// four-bit types, four for Q5_0, one for Q8_0, whose magnitudes multiply the activations carrying the
    /// weights' signs), the held-integer offset subtracted exactly, and the same float steps follow.
    ///
    /// # Safety
    /// As for a [`TileFn`], with `first + H ≤ 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group_halves<const R: usize, const K: usize, const H: usize>(
        w: &[u8],
        nb: usize,
        act: &Q8Rows,
        r0: usize,
        (out, stride): (*mut f32, usize),
        first: usize,
    ) {
        let kind = KINDS[K];
        let k = nb * QK;
        let block_bytes = GROUP * kind.block_bytes();
        let quant_bytes = group_quant_bytes(kind);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); H]; R];
        // Checked once here, so that the row loop carries no bounds checks.
        assert!((r0 + R) * nb <= act.d.len() && (r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let (qs, d, s, correction) = (act.qs.as_ptr(), act.d.as_ptr(), act.s.as_ptr(), act.correction.as_ptr());
        for b in 0..nb {
            let blk = w.as_ptr().add(b * block_bytes);
            if first == 0 {
                prefetch_ahead(blk, block_bytes);
            }
            for h in 0..H {
                let half = first + h;
                let wq = half_ints(kind, blk, half);
                let magnitudes: [__m256i; 8] =
                    if kind == BlockKind::Q8_0 { std::array::from_fn(|c| _mm256_abs_epi8(wq[c])) } else { wq };
                let at = |off: usize| _mm_loadu_si128(blk.add(quant_bytes + off + 16 * half) as *const __m128i);
                let dw = _mm256_cvtph_ps(at(0));
                let mw = if kind == BlockKind::Q4_1 { _mm256_cvtph_ps(at(32)) } else { _mm256_setzero_ps() };
                for (r, acc) in acc.iter_mut().enumerate() {
                    let y = |c: usize| {
                        let y =
                            _mm256_set1_epi32((qs.add((r0 + r) * k + b * QK + 4 * c) as *const i32).read_unaligned());
                        if kind == BlockKind::Q8_0 {
                            _mm256_sign_epi8(y, wq[c])
                        } else {
                            y
                        }
                    };
                    let pairs = |c: usize| _mm256_maddubs_epi16(magnitudes[c], y(c));
                    let widen = |from: usize, to: usize| {
                        let sum = (from + 1..to).fold(pairs(from), |a, c| _mm256_add_epi16(a, pairs(c)));
                        _mm256_madd_epi16(sum, ones)
                    };
                    let mut dot = match kind {
                        BlockKind::Q8_0 => (1..8).fold(widen(0, 1), |a, c| _mm256_add_epi32(a, widen(c, c + 1))),
                        BlockKind::Q5_0 => _mm256_add_epi32(widen(0, 4), widen(4, 8)),
                        BlockKind::Q4_0 | BlockKind::Q4_1 => widen(0, 8),
                    };
                    let i = (r0 + r) * nb + b;
                    if kind == BlockKind::Q4_0 || kind == BlockKind::Q5_0 {
                        dot = _mm256_sub_epi32(dot, _mm256_set1_epi32(*correction.add(i)));
                    }
                    let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(i)));
                    acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[h]);
                    if kind == BlockKind::Q4_1 {
                        acc[h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*s.add(i)), acc[h]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (h, acc) in acc.iter().enumerate() {
                _mm256_storeu_ps(out.add(r * stride + 8 * (first + h)), *acc);
            }
        }
    }

    /// 32 bytes, 0xFF where bit `i` of `bits` is set (llama.cpp's `bytes_from_bits_32`).
    ///
    /// # Safety
    /// The CPU supports AVX2. It reads no memory.
    #[target_feature(enable = "avx2")]
    unsafe fn bytes_from_bits(bits: u32) -> __m256i {
        let v = _mm256_set1_epi32(bits as i32);
        let shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        let spread = _mm256_shuffle_epi8(v, shuf);
        let mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe_u64 as i64);
        _mm256_cmpeq_epi8(_mm256_or_si256(spread, mask), _mm256_set1_epi64x(-1))
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{group_quant_bytes, prefetch_ahead, BlockKind, Q8Rows, GROUP, GROUP_TILE, KINDS, QK};
    use crate::kernels::amx::{pipelined, Tiles, ROWS};
    use crate::kernels::quant::GroupInts;

    /// A [`group_tile`] instance for one weight type and row count `R`: `tile(w, nb, act, r0, out, stride)`.
    ///
    /// Calling one is safe when the CPU supports AVX-512 F, BW, VNNI and F16C; `w` holds `nb` interleaved
    /// group-blocks of the instance's type (they are read unchecked); and `out` is valid for writes of
    /// `out[r · stride .. r · stride + 16]` for each `r < R`, elements no other thread accesses meanwhile. The
    /// activation rows `r0..r0 + R` are checked against `act`.
    pub type TileFn = unsafe fn(&[u8], usize, &Q8Rows, usize, *mut f32, usize);

    /// The instance compiled for `kind` and `rows` (1 to [`GROUP_TILE`]): with both constant, the type's branches
    /// fold away from the inner loop.
    pub fn tile_fn(kind: BlockKind, rows: usize) -> TileFn {
        macro_rules! rows {
            ($k:literal) => {
                match rows {
                    1 => group_tile::<1, $k>,
                    2 => group_tile::<2, $k>,
                    3 => group_tile::<3, $k>,
                    4 => group_tile::<4, $k>,
                    5 => group_tile::<5, $k>,
                    6 => group_tile::<6, $k>,
                    7 => group_tile::<7, $k>,
                    _ => group_tile::<GROUP_TILE, $k>,
                }
            };
        }
        match kind {
            BlockKind::Q4_0 => rows!(0),
            BlockKind::Q4_1 => rows!(1),
            BlockKind::Q5_0 => rows!(2),
            BlockKind::Q8_0 => rows!(3),
        }
    }

    /// [`super::quantize_block_scalar`] for one block with 512-bit registers: the same operations in the same
    /// order per element, so the same bits.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW and F16C, and `x` and `qs` hold at least 32 values each (they are read
    /// and written through raw pointers; the lengths are checked in debug builds only).
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn quantize_block(x: &[f32], qs: &mut [i8]) -> (f32, f32, i32) {
        debug_assert!(x.len() == QK && qs.len() == QK);
        let lo = _mm512_loadu_ps(x.as_ptr());
        let hi = _mm512_loadu_ps(x.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let round = _mm512_set1_ps(super::ROUND);
        let to_int = |v: __m512| _mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), round), round));
        let (ql, qh) = (to_int(lo), to_int(hi));
        _mm_storeu_si128(qs.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(ql));
        _mm_storeu_si128(qs.as_mut_ptr().add(16) as *mut __m128i, _mm512_cvtepi32_epi8(qh));
        let isum = _mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh));
        let f16_round = |v: f32| _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v))));
        (f16_round(d), f16_round(d * isum as f32), isum)
    }

    /// [`quantize_block`] on 16 consecutive blocks (`x`: 512 values) at once: the same operations per element,
    /// so the same bits, with each step that is scalar per block (the maximum and the sum over a block, the
    /// scale and its inverse, the rounding through f16) done for the 16 blocks in one register. Writes the
    /// integers to `qs`, and per block the scale, `d · Σq` and `Σq`. Batching the per-block steps matters
    /// because quantizing activations is a visible part of a verification forward.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW and F16C (the lengths are checked).
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn quantize_16_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], s: &mut [f32], isum: &mut [i32]) {
        use crate::kernels::simd::{fold16, FOLD16_SLOT};
        assert!(x.len() == 16 * QK && qs.len() == 16 * QK && d.len() == 16 && s.len() == 16 && isum.len() == 16);
        let x = x.as_ptr();
        let half = |b: usize, h: usize| _mm512_loadu_ps(x.add(b * QK + 16 * h));
        let mut a = [_mm512_setzero_ps(); 16];
        for (b, slot) in FOLD16_SLOT.iter().enumerate() {
            a[*slot] = _mm512_max_ps(_mm512_abs_ps(half(b, 0)), _mm512_abs_ps(half(b, 1)));
        }
        let amax = fold16::<true>(&a);
        let dv = _mm512_div_ps(amax, _mm512_set1_ps(127.0));
        let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(dv, _mm512_setzero_ps());
        let mut ids = [0f32; 16];
        _mm512_storeu_ps(ids.as_mut_ptr(), _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), dv));
        let round = _mm512_set1_ps(super::ROUND);
        for (b, slot) in FOLD16_SLOT.iter().enumerate() {
            let id = _mm512_set1_ps(ids[b]);
            let to_int =
                |v: __m512| _mm512_cvtps_epi32(_mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, id), round), round));
            let (ql, qh) = (to_int(half(b, 0)), to_int(half(b, 1)));
            _mm_storeu_si128(qs.as_mut_ptr().add(b * QK) as *mut __m128i, _mm512_cvtepi32_epi8(ql));
            _mm_storeu_si128(qs.as_mut_ptr().add(b * QK + 16) as *mut __m128i, _mm512_cvtepi32_epi8(qh));
            // Sums of at most 32 · 127 in magnitude: exact in f32 whatever the order.
            a[*slot] = _mm512_cvtepi32_ps(_mm512_add_epi32(ql, qh));
        }
        let sums = fold16::<false>(&a);
        let f16_round = |v: __m512| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v));
        _mm512_storeu_ps(d.as_mut_ptr(), f16_round(dv));
        _mm512_storeu_ps(s.as_mut_ptr(), f16_round(_mm512_mul_ps(dv, sums)));
        _mm512_storeu_si512(isum.as_mut_ptr() as *mut _, _mm512_cvtps_epi32(sums));
    }

    /// The held integers of the group-block at `blk`: vector c holds elements 4c..4c + 4 of the 16 rows, as
    /// `vpdpbusd` takes them and as a tile holds a block's weights in its 8 rows.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW, and `blk` is valid for reads of one group-block of `kind`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block_ints(kind: BlockKind, blk: *const u8) -> [__m512i; 8] {
        let mut wq = [_mm512_setzero_si512(); 8];
        if kind == BlockKind::Q8_0 {
            for (c, v) in wq.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(blk.add(64 * c) as *const _);
            }
            return wq;
        }
        let low = _mm512_set1_epi8(0x0F);
        for c in 0..4 {
            let v = _mm512_loadu_si512(blk.add(64 * c) as *const _);
            wq[c] = _mm512_and_si512(v, low);
            wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        if kind == BlockKind::Q5_0 {
            let fifth = _mm512_set1_epi8(0x10);
            for (c, v) in wq.iter_mut().enumerate() {
                let bits = (blk.add(256 + 8 * c) as *const u64).read_unaligned();
                *v = _mm512_mask_add_epi8(*v, bits, *v, fifth);
            }
        }
        wq
    }

    /// A group's integers (`w`: whole group-blocks of `kind`) as the AMX tile takes them: per block, the 8
    /// vectors of [`block_ints`] less the type's offset, as signed bytes (512 per block), so that a tile's
    /// integer dot product equals the VNNI kernel's after its offset correction.
    ///
    /// # Safety
    /// The CPU supports AVX-512 F and BW (the lengths are checked).
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn unpack_signed(kind: BlockKind, w: &[u8], out: &mut [i8]) {
        let block_bytes = GROUP * kind.block_bytes();
        assert_eq!(out.len(), w.len() / block_bytes * 512, "unpacked bytes of a {kind:?} group");
        let offset = _mm512_set1_epi8(kind.offset() as u8 as i8);
        for (blk, dst) in w.chunks_exact(block_bytes).zip(out.chunks_exact_mut(512)) {
            for (c, v) in block_ints(kind, blk.as_ptr()).iter().enumerate() {
                _mm512_storeu_si512(dst.as_mut_ptr().add(64 * c) as *mut _, _mm512_sub_epi8(*v, offset));
            }
        }
    }

    /// [`group_tile`] for 16 activation rows through AMX tiles, for Q4_0, Q5_0 and Q8_0: the integer dot
    /// products of 2 blocks at a time from [`Tiles::dots`] against the group's `unpacked` integers (the next 2
    /// asked for before these are scaled, so that the tiles work while the vector units scale), then per row
    /// and block the same scaling as the VNNI tile: the same operations in the same order, so the same bits.
    ///
    /// # Safety
    /// AVX-512 F, BW and F16C; `tiles` configured on this thread; `w` one group of `kind`, `unpacked` its
    /// [`unpack_signed`] integers and `dots` room for 4 tile results; `out` valid for writes of 16 floats at
    /// each `r · stride`, `r < 16`, that no other thread accesses meanwhile. The activation rows are checked.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn amx_tile(
        kind: BlockKind,
        tiles: &Tiles,
        (w, unpacked, dots): GroupInts,
        act: &Q8Rows,
        r0: usize,
        (out, stride): (*mut f32, usize),
    ) {
        const CHUNK: usize = 2;
        let block_bytes = GROUP * kind.block_bytes();
        let nb = w.len() / block_bytes;
        let k = nb * QK;
        let quant_bytes = group_quant_bytes(kind);
        assert!((r0 + ROWS) * nb <= act.d.len() && (r0 + ROWS) * k <= act.qs.len(), "activation rows {r0}..+16");
        assert!(unpacked.len() == nb * 512 && dots.len() >= 2 * CHUNK, "unpacked integers of the group");
        assert_ne!(kind, BlockKind::Q4_1, "Q4_1 has no AMX tile");
        let d = act.d.as_ptr();
        let blocks = |c: usize| c * CHUNK..nb.min((c + 1) * CHUNK);
        let mut acc = [_mm512_setzero_ps(); ROWS];
        let ask = |c: usize, into: &mut [[i32; ROWS * ROWS]]| {
            let b = blocks(c);
            let a = act.qs.as_ptr().add(r0 * k + b.start * QK);
            // SAFETY: 16 activation rows of `k` from r0 exist (checked), of which these blocks' bytes are read;
            // `unpacked` holds every block (checked).
            tiles.dots::<QK>(a, k, unpacked.as_ptr().add(b.start * 512), &mut into[..b.len()]);
        };
        let scale = |c: usize, from: &[[i32; ROWS * ROWS]]| {
            for (b, dot) in blocks(c).zip(from) {
                let blk = w.as_ptr().add(b * block_bytes);
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(quant_bytes) as *const __m256i));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let dot = _mm512_loadu_si512(dot.as_ptr().add(ROWS * r) as *const _);
                    let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d.add((r0 + r) * nb + b)));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc);
                }
            }
        };
        pipelined(&mut dots[..2 * CHUNK], nb.div_ceil(CHUNK), ask, scale);
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * stride), *acc);
        }
    }

    /// `R` activation rows (from `r0`) against one interleaved group of 16 weight rows (`w`: `nb` group-blocks):
    /// writes `out[r · stride .. r · stride + 16]` for each. Per row and block: 8 `vpdpbusd` give the 16 integer
    /// dot products, the held-integer offset is subtracted exactly, and one FMA scales them into the sums; the
    /// same sequence whatever `R`.
    ///
    /// # Safety
    /// As for a [`TileFn`]: AVX-512 F, BW, VNNI and F16C; `w` holds `nb` group-blocks of `KINDS[K]`; `out` is
    /// valid for writes of 16 floats at each `r · stride`, `r < R`, that no other thread accesses meanwhile.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    unsafe fn group_tile<const R: usize, const K: usize>(
        w: &[u8],
        nb: usize,
        act: &Q8Rows,
        r0: usize,
        out: *mut f32,
        stride: usize,
    ) {
        let kind = KINDS[K];
        let k = nb * QK;
        let block_bytes = GROUP * kind.block_bytes();
        let quant_bytes = group_quant_bytes(kind);
        let mut acc = [_mm512_setzero_ps(); R];
        // Checked once here, so that the row loop carries no bounds checks (scalar work next to the vector ops).
        assert!((r0 + R) * nb <= act.d.len() && (r0 + R) * k <= act.qs.len(), "activation rows {r0}..{}", r0 + R);
        let (qs, d, s, correction) = (act.qs.as_ptr(), act.d.as_ptr(), act.s.as_ptr(), act.correction.as_ptr());
        for b in 0..nb {
            let blk = w.as_ptr().add(b * block_bytes);
            prefetch_ahead(blk, block_bytes);
            let wq = block_ints(kind, blk);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(quant_bytes) as *const __m256i));
            let mw = if kind == BlockKind::Q4_1 {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(quant_bytes + 32) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            // Two chains of four `vpdpbusd` per row, the rows' chains interleaved: 2R independent accumulators
            // keep both vector ports busy (a chain's result is ready only every 6 cycles). The exact integer
            // offset starts one of them, so no subtraction is needed.
            let y = |r: usize, c: usize| {
                _mm512_set1_epi32((qs.add((r0 + r) * k + b * QK + 4 * c) as *const i32).read_unaligned())
            };
            let mut d0: [__m512i; R] = std::array::from_fn(|r| {
                if kind.offset() == 0 {
                    _mm512_setzero_si512()
                } else {
                    _mm512_set1_epi32(-*correction.add((r0 + r) * nb + b))
                }
            });
            let mut d1 = [_mm512_setzero_si512(); R];
            for c in (0..8).step_by(2) {
                for r in 0..R {
                    d0[r] = _mm512_dpbusd_epi32(d0[r], wq[c], y(r, c));
                    d1[r] = _mm512_dpbusd_epi32(d1[r], wq[c + 1], y(r, c + 1));
                }
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let i = (r0 + r) * nb + b;
                let dot = _mm512_add_epi32(d0[r], d1[r]);
                let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*d.add(i)));
                *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, *acc);
                if kind == BlockKind::Q4_1 {
                    *acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(*s.add(i)), *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(r * stride), *acc);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::kernels::quant::{matmul_shared, matmul_silu_gated};

    fn weights(kind: GgmlDType, n: usize, k: usize) -> QTensor {
        let vals: Vec<f32> =
            (0..n * k).map(|i| ((i * 37 % 101) as f32 / 50.0 - 1.0) * (1.0 + (i % 7) as f32)).collect();
        let t = Tensor::from_vec(vals, (n, k), &Device::Cpu).unwrap();
        QTensor::quantize(&t, kind).unwrap()
    }

    /// `m` activation rows of `k`, deterministic.
    pub(in crate::kernels) fn input(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| ((i * 13 % 29) as f32 / 14.0 - 1.0) * 0.5).collect()
    }

    /// `y` (our product of `x`, `[m, k]`, with `q`) is within 1e-4 relative of candle's kernel for `q`.
    pub(in crate::kernels) fn assert_matches_candle(q: QTensor, x: &[f32], m: usize, y: &[f32], what: &str) {
        use candle_core::Module;
        let k = x.len() / m;
        let reference = candle_core::quantized::QMatMul::from_qtensor(q)
            .unwrap()
            .forward(&Tensor::from_vec(x.to_vec(), (m, k), &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(y.len(), reference.len());
        for (i, (a, b)) in y.iter().zip(&reference).enumerate() {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{what} [{i}]: {a} vs candle {b}");
        }
    }

    /// Every layout this machine runs, with the types it takes.
    fn variants() -> Vec<(GgmlDType, Layout)> {
        let kinds = [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0];
        let mut v: Vec<_> = kinds.iter().map(|&kind| (kind, Layout::Rows)).collect();
        if Isa::detect().is_simd() {
            v.extend(kinds.iter().map(|&kind| (kind, Layout::Interleaved)));
        }
        v
    }

    /// The vectorized activation quantization gives the scalar one's bits, ties (x.5 after scaling) included.
    #[test]
    fn simd_quantization_matches_scalar() {
        if Isa::detect() != Isa::Avx512Vnni {
            return;
        }
        let mut blocks: Vec<Vec<f32>> =
            (0..200).map(|b| input(1, QK).iter().map(|v| v * (b as f32 * 0.37 - 20.0)).collect()).collect();
        blocks.push((0..QK).map(|i| i as f32 - 15.5).collect());
        blocks.push(vec![0.0; QK]);
        for x in blocks {
            let (mut a, mut b) = ([0i8; QK], [0i8; QK]);
            let scalar = quantize_block_scalar(&x, &mut a);
            // SAFETY: AVX-512 was detected.
            let simd = unsafe { avx512::quantize_block(&x, &mut b) };
            assert_eq!((scalar, a), (simd, b), "block {x:?}");
        }
        // Sixteen blocks at a time (three batches and two single blocks), the special blocks among them.
        let mut values = input(2, 25 * QK);
        values.iter_mut().enumerate().for_each(|(i, v)| *v *= (i / QK) as f32 * 0.37 - 8.0);
        values[5 * QK..6 * QK].fill(0.0);
        values[20 * QK..21 * QK].iter_mut().enumerate().for_each(|(i, v)| *v = i as f32 - 15.5);
        let q = Q8Rows::quantize(&values, 2, 25 * QK, 3);
        for (b, x) in values.chunks_exact(QK).enumerate() {
            let mut a = [0i8; QK];
            let (d, s, isum) = quantize_block_scalar(x, &mut a);
            assert_eq!((d, s, 3 * isum, &a[..]), (q.d[b], q.s[b], q.correction[b], &q.qs[b * QK..][..QK]), "block {b}");
        }
    }

    /// Against candle's own kernel for these types, which quantizes activations the same way. 70 rows is not a
    /// multiple of the interleaved group, so the padding is covered too.
    #[test]
    fn matches_candle_kernel() {
        for (kind, layout) in variants() {
            let (n, k, m) = (70, 96, 6);
            let q = weights(kind, n, k);
            let bm = BlockMatrix::with_layout(&q, layout).unwrap().unwrap();
            let x = input(m, k);
            let y = bm.matmul(&x, m);
            assert_matches_candle(q, &x, m, &y, &format!("{kind:?} {layout:?}"));
        }
    }

    /// Products sharing one quantization of their activations give each product's own bits, for every type,
    /// row count and a row count that is not a multiple of 16; weights that differ in type are refused.
    #[test]
    fn shared_products_match_their_own() {
        if !Isa::detect().is_simd() {
            return;
        }
        let k = 96;
        for kind in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            let mats: Vec<BlockMatrix> = [48, 70, 16]
                .iter()
                .map(|&n| BlockMatrix::with_layout(&weights(kind, n, k), Layout::Interleaved).unwrap().unwrap())
                .collect();
            let kernels: Vec<&dyn QuantKernel> = mats.iter().map(|b| b as &dyn QuantKernel).collect();
            for m in [1, 3, 8, 11] {
                let x = input(m, k);
                let shared = matmul_shared(&kernels, &x, m, k).unwrap();
                for (b, y) in mats.iter().zip(&shared) {
                    assert_eq!(y, &b.matmul(&x, m), "{kind:?} {m} rows, {} outputs", b.n);
                }
            }
        }
        let other = BlockMatrix::with_layout(&weights(GgmlDType::Q8_0, 16, k), Layout::Interleaved).unwrap().unwrap();
        let q4 = BlockMatrix::with_layout(&weights(GgmlDType::Q4_1, 16, k), Layout::Interleaved).unwrap().unwrap();
        assert!(matmul_shared(&[&q4, &other], &input(1, k), 1, k).is_none());
        assert!(matmul_silu_gated(&q4, &other, &input(1, k), 1, k).is_none());
    }

    /// Rows computed through AMX tiles (16 at a time) are bit for bit the same rows computed alone through
    /// VNNI, for every type (Q4_1 through VNNI only), alone, shared and gated; 11 blocks leave an odd block in
    /// the tile calls, and 37 rows leave 5 rows to VNNI in the same product.
    #[test]
    fn tile_rows_match_vnni_rows() {
        use std::sync::atomic::Ordering;
        if Isa::detect() != Isa::Avx512Vnni {
            return;
        }
        let tiles = crate::kernels::amx::tested_here("tile_rows_match_vnni_rows");
        let before = crate::kernels::amx::PRODUCTS.load(Ordering::Relaxed);
        let (n, k, m) = (70, 11 * QK, 37);
        let x = input(m, k);
        for kind in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            let bm = BlockMatrix::with_layout(&weights(kind, n, k), Layout::Interleaved).unwrap().unwrap();
            let up_values: Vec<f32> = input(64, k).iter().map(|v| v * 3.0).collect();
            let up_q = QTensor::quantize(&Tensor::from_vec(up_values, (64, k), &Device::Cpu).unwrap(), kind).unwrap();
            let up = BlockMatrix::with_layout(&up_q, Layout::Interleaved).unwrap().unwrap();
            let gate = BlockMatrix::with_layout(&weights(kind, 64, k), Layout::Interleaved).unwrap().unwrap();
            let all = bm.matmul(&x, m);
            let (ups, gates) = (up.matmul(&x, m), gate.matmul(&x, m));
            for r in 0..m {
                let row = &x[r * k..(r + 1) * k];
                assert_eq!(&all[r * n..(r + 1) * n], &bm.matmul(row, 1)[..], "{kind:?} row {r}");
                assert_eq!(&ups[r * 64..(r + 1) * 64], &up.matmul(row, 1)[..], "{kind:?} up row {r}");
            }
            assert_eq!(matmul_shared(&[&bm, &up], &x, m, k).unwrap(), [all, ups.clone()], "{kind:?} shared");
            let mut expected = ups;
            crate::kernels::activations::silu_mul(&gates, &mut expected);
            assert_eq!(matmul_silu_gated(&gate, &up, &x, m, k).unwrap(), expected, "{kind:?} gated");
        }
        if tiles {
            assert!(crate::kernels::amx::PRODUCTS.load(Ordering::Relaxed) > before, "no tile product ran");
        }
    }

    /// The gated product gives the bits of the gate and up products followed by `silu_mul`.
    #[test]
    fn silu_gated_matches_products_then_silu() {
        if !Isa::detect().is_simd() {
            return;
        }
        let (n, k) = (64, 128);
        for kind in [GgmlDType::Q4_1, GgmlDType::Q5_0] {
            let gate = BlockMatrix::with_layout(&weights(kind, n, k), Layout::Interleaved).unwrap().unwrap();
            let up_values: Vec<f32> = input(n, k).iter().map(|v| v * 3.0).collect();
            let up_q = QTensor::quantize(&Tensor::from_vec(up_values, (n, k), &Device::Cpu).unwrap(), kind).unwrap();
            let up = BlockMatrix::with_layout(&up_q, Layout::Interleaved).unwrap().unwrap();
            for m in [1, 5, 8, 13] {
                let x = input(m, k);
                let mut expected = up.matmul(&x, m);
                crate::kernels::activations::silu_mul(&gate.matmul(&x, m), &mut expected);
                assert_eq!(matmul_silu_gated(&gate, &up, &x, m, k).unwrap(), expected, "{kind:?} {m} rows");
            }
        }
    }

    /// One output of the interleaved tiles written out in scalar code: per block the exact integer dot product
    /// less the held integers' offset, scaled by `d_w · d_a` in one fused step (Q4_1: then `+ m · s` in another),
    /// in block order. Every instruction set must give these bits.
    fn reference(kind: BlockKind, row: &[u8], act: &Q8Rows, r: usize) -> f32 {
        let nb = row.len() / kind.block_bytes();
        let mut acc = 0f32;
        for (b, block) in row.chunks_exact(kind.block_bytes()).enumerate() {
            let (q, dw, m) = unpack_scalar(kind, block);
            let i = r * nb + b;
            let a = &act.qs[(r * nb + b) * QK..][..QK];
            let mut dot: i32 = q.iter().zip(a).map(|(&q, &a)| q as i32 * a as i32).sum();
            if kind.offset() != 0 {
                dot -= act.correction[i];
            }
            acc = (dot as f32).mul_add(dw * act.d[i], acc);
            if kind == BlockKind::Q4_1 {
                acc = m.mul_add(act.s[i], acc);
            }
        }
        acc
    }

    /// The interleaved tiles of this machine (AVX-512 or AVX2) give each output the reference's bits, for 1
    /// to 8 activation rows (AVX2 tiles of 4 and the rest) and a row count that is not a multiple of the group:
    /// an AVX-512 and an AVX2 machine decode the same text.
    #[test]
    fn interleaved_tiles_give_the_reference_bits() {
        if !Isa::detect().is_simd() {
            eprintln!("interleaved_tiles_give_the_reference_bits: NOT RUN, this CPU has neither AVX2 nor AVX-512");
            return;
        }
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0] {
            let (n, k) = (40, 5 * QK);
            let q = weights(dtype, n, k);
            let kind = BlockKind::of(dtype).unwrap();
            let bm = BlockMatrix::with_layout(&q, Layout::Interleaved).unwrap().unwrap();
            let data = q.data().unwrap();
            for m in [1, 2, 3, 4, 5, 8] {
                let x = input(m, k);
                let act = Q8Rows::quantize(&x, m, k, kind.offset());
                let y = bm.matmul(&x, m);
                for r in 0..m {
                    for (i, row) in data.chunks_exact(data.len() / n).enumerate() {
                        let expected = reference(kind, row, &act, r);
                        let got = y[r * n + i];
                        assert_eq!(
                            got.to_bits(),
                            expected.to_bits(),
                            "{dtype:?} {m} rows: [{r}, {i}] {got} vs {expected}"
                        );
                    }
                }
            }
        }
    }

    /// A row's result does not depend on the other rows, in either layout.
    #[test]
    fn rows_are_independent() {
        for (kind, layout) in variants() {
            let (n, k, m) = (40, 128, 5);
            let q = weights(kind, n, k);
            let bm = BlockMatrix::with_layout(&q, layout).unwrap().unwrap();
            let x = input(m, k);
            let all = bm.matmul(&x, m);
            for r in 0..m {
                let one = bm.matmul(&x[r * k..(r + 1) * k], 1);
                assert_eq!(&all[r * n..(r + 1) * n], &one[..], "{kind:?} {layout:?} row {r}");
            }
        }
    }
}
