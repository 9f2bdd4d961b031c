//! Quantized matrix products on our own kernels: the interface every block family implements, and the
//! products that share one quantization of their activations between several weights.
//!
//! Hand-written because candle 0.11's quantized dot products are scalar on x86 for Q4_1 and Q5_0 and pay
//! for each extra row almost in full for Q4_K and Q6_K, and because each output row must get the same
//! arithmetic whatever the number of rows in the product, so that a token verified in a block gets the bits it
//! gets decoded alone (greedy speculation stays lossless bit for bit). The unsafe code here hands each task
//! its part of an output that several threads share, and calls a group's tile (`GroupTiles::run`), which
//! writes there through a raw pointer.

pub mod blocks32;
#[cfg(target_arch = "x86_64")]
pub mod kquants;

use std::sync::Arc;

use crate::error::Result;
use crate::kernels::amx::{self, Tiles};
use crate::kernels::parallel::{for_each_chunk, SharedOut};
use candle_core::quantized::GgmlDType;

/// Weight rows per interleaved group: the 16 i32 lanes of an AVX-512 register.
pub(crate) const GROUP: usize = 16;

/// Activation rows a group's tile computes at once (the interleaved layouts' 32 AVX-512 registers).
pub(crate) const GROUP_TILE: usize = 8;

/// Activation rows an AVX2 tile computes at once: four rows' accumulators and the weights' vectors fill its 16
/// registers.
pub(crate) const AVX2_TILE: usize = 4;

/// A quantized weight `[n, k]` that one of our kernels multiplies (see also `kquants`).
pub trait QuantKernel: Send + Sync {
    fn out_features(&self) -> usize;
    /// The stored type this kernel multiplies.
    fn dtype(&self) -> GgmlDType;
    /// The first `n` outputs of the product with `x` (`[m, k]` row-major) → `[m, min(n, out)]`, reading only
    /// those weight rows; each is the same as in the full product.
    fn matmul_first(&self, x: &[f32], m: usize, n: usize) -> Vec<f32>;
    /// The weight's rows `ids` as a kernel of the same kind (a drafter's reduced LM head), where this kernel
    /// keeps its rows as stored; `None` where it regrouped them.
    fn gather(&self, _ids: &[u32]) -> Result<Option<Arc<dyn QuantKernel>>> {
        Ok(None)
    }
    /// This kernel's side of the products that share activations ([`matmul_shared`], [`matmul_silu_gated`]),
    /// where it has one.
    fn shared(&self) -> Option<&dyn SharedKernel> {
        None
    }
}

/// A kernel over interleaved 16-row groups whose quantized activations other kernels of the same
/// [`ActFormat`] can take as they are.
pub trait SharedKernel {
    fn format(&self) -> ActFormat;
    /// `x` (`[m, k]`) quantized in this kernel's format.
    fn quantize(&self, x: &[f32], m: usize) -> SharedActivations;
    /// This kernel's groups, and its tile over `act` (quantized in its format).
    fn group_tiles<'a>(&'a self, act: &'a SharedActivations) -> GroupTiles<'a>;
}

/// How a kernel quantizes its activations (`k` wide): kernels with equal formats share one quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActFormat {
    /// llama.cpp's Q8_1 per 32 elements, with the integer offset of the weights' held integers.
    Blocks { k: usize, offset: i32 },
    /// llama.cpp's Q8_K per 256 elements (`kquants`).
    SuperBlocks { k: usize },
}

/// Activations quantized once for several products.
pub enum SharedActivations {
    Blocks(blocks32::Q8Rows),
    #[cfg(target_arch = "x86_64")]
    SuperBlocks(kquants::Q8KRows),
}

/// A weight's 16-row groups (`n` rows, `group_bytes` per group in `data`) and the tile that runs one over
/// activations quantized by one of the weight's kernels ([`SharedKernel::group_tiles`]). The fields are private
/// to this module and its block families, whose kernels alone know what the tile needs: it is called only
/// through the unsafe `GroupTiles::run`.
pub struct GroupTiles<'a> {
    data: &'a [u8],
    n: usize,
    group_bytes: usize,
    /// The most activation rows `tile` takes at once ([`GROUP_TILE`] or [`AVX2_TILE`]).
    rows: usize,
    tile: GroupTile<'a>,
    amx: Option<AmxTile<'a>>,
}

/// The AMX side of a weight's group tiles, where its family has one and tiles are available: a group's
/// integers unpacked once into signed tile rows (`unpacked_bytes`, by `unpack(group, bytes)`), then 16
/// activation rows at a time against them, with the same bits as the VNNI tile.
pub(crate) struct AmxTile<'a> {
    unpacked_bytes: usize,
    unpack: UnpackFn<'a>,
    tile: AmxTileFn<'a>,
}

/// `unpack(group, ints)`: a group's stored bytes to the signed integers its AMX tile reads.
type UnpackFn<'a> = Box<dyn Fn(&[u8], &mut [i8]) + Sync + 'a>;

/// `tile(tiles, (w, unpacked, dots), r0, at, stride)`: activation rows `r0..r0 + 16` against group `w` (its
/// integers `unpacked`; `dots` room for [`DOT_BLOCKS`] tile results), written as a [`GroupTile`] writes them:
/// unchecked, so called only under `run_rows`' contract.
type AmxTileFn<'a> = Box<dyn Fn(&Tiles, GroupInts, usize, *mut f32, usize) + Sync + 'a>;

/// A group as the AMX tile reads it: its stored bytes, its unpacked integers, and room for tile results.
pub(crate) type GroupInts<'s> = (&'s [u8], &'s [i8], &'s mut [[i32; amx::ROWS * amx::ROWS]]);

/// Tile results an AMX tile holds at once (two super-blocks of 16 Q6_K sub-blocks).
pub(crate) const DOT_BLOCKS: usize = 32;

/// A task's unpacked group for the AMX tile: which group (by the task's own numbering) and its integers, and
/// the task's room for tile results.
#[derive(Default)]
struct Unpacked {
    group: Option<usize>,
    bytes: Vec<i8>,
    dots: Vec<[i32; amx::ROWS * amx::ROWS]>,
}

/// `tile(w, r0, rows, at, stride)`: [`GroupTiles::run`] on the group `w` (`group_bytes` of `data`). It writes
/// through `at` unchecked, so it is safe to call only under `run`'s contract.
type GroupTile<'a> = Box<dyn Fn(&[u8], usize, usize, *mut f32, usize) + Sync + 'a>;

impl GroupTiles<'_> {
    /// Activation rows `r0..r0 + rows` against group `g` (its 16 weight rows): writes
    /// `at[r · stride .. r · stride + 16]` for each `r < rows`. A row outside the activations, or a group past
    /// the weight's, panics.
    ///
    /// # Safety
    /// `1 ≤ rows ≤ self.rows`; `at` is valid for writes of `(rows − 1) · stride + 16` floats, and no element
    /// it writes is accessed by another thread meanwhile.
    pub(crate) unsafe fn run(&self, g: usize, r0: usize, rows: usize, at: *mut f32, stride: usize) {
        debug_assert!((1..=self.rows).contains(&rows), "{rows} rows in a tile");
        let w = &self.data[g * self.group_bytes..(g + 1) * self.group_bytes];
        (self.tile)(w, r0, rows, at, stride)
    }

    /// Whether 16-row tiles serve this weight with `tiles` (configured on the calling thread).
    fn sixteen(&self, tiles: Option<&Tiles>) -> bool {
        tiles.is_some() && self.amx.is_some()
    }

    /// [`Self::run`] for a tile of [`row_tiles`], which may be 16 rows where [`Self::sixteen`]: those go
    /// through the AMX tile, group `g`'s integers unpacked into `unpacked` first unless it holds them
    /// (`key` names the group there).
    ///
    /// # Safety
    /// As for [`Self::run`], with `rows` up to 16 where `self.sixteen(tiles)`.
    unsafe fn run_rows(
        &self,
        (g, key): (usize, usize),
        (r0, rows): (usize, usize),
        (at, stride): (*mut f32, usize),
        tiles: Option<&Tiles>,
        unpacked: &mut Unpacked,
    ) {
        match (tiles, &self.amx) {
            (Some(tiles), Some(amx)) if rows == amx::ROWS => {
                let w = &self.data[g * self.group_bytes..(g + 1) * self.group_bytes];
                if unpacked.group != Some(key) {
                    unpacked.bytes.resize(amx.unpacked_bytes, 0);
                    (amx.unpack)(w, &mut unpacked.bytes);
                    unpacked.group = Some(key);
                }
                unpacked.dots.resize(DOT_BLOCKS, [0; amx::ROWS * amx::ROWS]);
                (amx.tile)(tiles, (w, &unpacked.bytes, &mut unpacked.dots), r0, at, stride)
            }
            _ => self.run(g, r0, rows, at, stride),
        }
    }
}

/// The row tiles `(first row, rows)` of an `m`-row product: 16 at a time where `sixteen`, the rest (all of
/// them otherwise) up to `most` (the weights' [`GroupTiles::rows`]) at a time.
fn row_tiles(m: usize, sixteen: bool, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let full = if sixteen { m / amx::ROWS * amx::ROWS } else { 0 };
    let tiles = (0..full).step_by(amx::ROWS).map(|r0| (r0, amx::ROWS));
    tiles.chain((full..m).step_by(most).map(move |r0| (r0, most.min(m - r0))))
}

/// The AMX tiles for a task of an `m`-row product: configured only for 16 rows or more, where `wanted` (a
/// weight of the product has an AMX tile).
fn tiles_for(m: usize, wanted: bool) -> Option<Tiles> {
    (wanted && m >= amx::ROWS).then(Tiles::configure).flatten()
}

/// The shared sides of `kernels` if all have one, of one activation format `k` wide.
fn alike<'a>(kernels: &[&'a dyn QuantKernel], k: usize) -> Option<Vec<&'a dyn SharedKernel>> {
    let shared: Vec<&dyn SharedKernel> = kernels.iter().map(|q| q.shared()).collect::<Option<_>>()?;
    let format = shared.first()?.format();
    let k_of = |f: ActFormat| match f {
        ActFormat::Blocks { k, .. } | ActFormat::SuperBlocks { k } => k,
    };
    (k_of(format) == k && shared.iter().all(|s| s.format() == format)).then_some(shared)
}

/// The products of the same activations `x` (`[m, k]`) with several weights, such as a layer's q, k and v
/// projections: where all quantize activations alike, `x` is quantized once and the groups of all of them
/// share one parallel region (one hand-off instead of one per weight). Each result (`[m, n_i]`) is bit for bit
/// that weight's own product. `None` where they differ.
pub fn matmul_shared(kernels: &[&dyn QuantKernel], x: &[f32], m: usize, k: usize) -> Option<Vec<Vec<f32>>> {
    let shared = alike(kernels, k)?;
    let act = shared[0].quantize(x, m);
    let parts: Vec<GroupTiles> = shared.iter().map(|s| s.group_tiles(&act)).collect();
    Some(over_groups_of(&parts, m))
}

/// `silu(x·gateᵀ) · (x·upᵀ)` (`[m, n]`), a gated MLP's hidden activations, in one pass where both weights
/// quantize activations alike: `x` quantized once, and each group's SiLU product taken as its two tiles come
/// out, while they are in cache, instead of over two whole outputs afterwards. The same bits as the two
/// products followed by [`crate::kernels::activations::silu_mul`]. `None` where they differ.
pub fn matmul_silu_gated(
    gate: &dyn QuantKernel,
    up: &dyn QuantKernel,
    x: &[f32],
    m: usize,
    k: usize,
) -> Option<Vec<f32>> {
    let n = gate.out_features();
    if up.out_features() != n || !n.is_multiple_of(GROUP) {
        return None;
    }
    let shared = alike(&[gate, up], k)?;
    let act = shared[0].quantize(x, m);
    let (gate, up) = (shared[0].group_tiles(&act), shared[1].group_tiles(&act));
    let mut out = vec![0f32; m * n];
    let dst = SharedOut::new(&mut out);
    for_each_chunk(n / GROUP, |range| {
        let mut gated = [0f32; amx::ROWS * GROUP];
        let tiles = tiles_for(m, gate.amx.is_some() && up.amx.is_some());
        let sixteen = gate.sixteen(tiles.as_ref()) && up.sixteen(tiles.as_ref());
        let (mut gate_ints, mut up_ints) = (Unpacked::default(), Unpacked::default());
        for g in range {
            for (r0, rows) in row_tiles(m, sixteen, gate.rows.min(up.rows)) {
                let tiles = tiles.as_ref();
                // SAFETY: a tile of `row_tiles` (16 rows only where both weights take them); `gated` is this
                // task's own, 16 rows of 16.
                unsafe { gate.run_rows((g, g), (r0, rows), (gated.as_mut_ptr(), GROUP), tiles, &mut gate_ints) };
                // SAFETY: this task alone writes group g's 16 columns of `out` (`[m, n]`).
                let at = unsafe { dst.ptr(r0 * n + g * GROUP, (rows - 1) * n + GROUP) };
                // SAFETY: a tile of `row_tiles`, as for the gate; `at` spans `(rows − 1) · n + 16` floats of `out`
                // (checked by `ptr`), of which the tile writes group g's columns, this task's alone.
                unsafe { up.run_rows((g, g), (r0, rows), (at, n), tiles, &mut up_ints) };
                for r in 0..rows {
                    // SAFETY: row r0 + r's 16 columns of group g, written by this task only.
                    let u = unsafe { std::slice::from_raw_parts_mut(at.add(r * n), GROUP) };
                    crate::kernels::activations::silu_mul_here(&gated[r * GROUP..][..GROUP], u);
                }
            }
        }
    });
    Some(out)
}

/// The product `[m, part.n]` of a weight's first `part.n` rows with `m` activation rows, the groups shared out
/// over the pool.
pub(crate) fn over_groups(part: GroupTiles, m: usize) -> Vec<f32> {
    over_groups_of(std::slice::from_ref(&part), m).pop().expect("one product")
}

/// [`over_groups`] for several weights with the same activations, all their groups in one parallel region →
/// one `[m, n]` per weight.
fn over_groups_of(parts: &[GroupTiles], m: usize) -> Vec<Vec<f32>> {
    let groups: Vec<usize> = parts.iter().map(|p| p.n.div_ceil(GROUP)).collect();
    let mut outs: Vec<Vec<f32>> = groups.iter().map(|g| vec![0f32; m * g * GROUP]).collect();
    let dsts: Vec<SharedOut> = outs.iter_mut().map(|o| SharedOut::new(o)).collect();
    // Task i is group `i − starts[p]` of part p, for the last p with `starts[p] ≤ i`.
    let starts: Vec<usize> = groups.iter().scan(0, |s, g| Some(std::mem::replace(s, *s + g))).collect();
    for_each_chunk(groups.iter().sum(), |range| {
        let tiles = tiles_for(m, parts.iter().any(|p| p.amx.is_some()));
        let mut unpacked = Unpacked::default();
        for i in range {
            let p = starts.partition_point(|&s| s <= i) - 1;
            let (part, g, padded) = (&parts[p], i - starts[p], groups[p] * GROUP);
            for (r0, rows) in row_tiles(m, part.sixteen(tiles.as_ref()), part.rows) {
                // SAFETY: this group's 16 columns of part p's output (`[m, padded]`) are written by this task only.
                let at = unsafe { dsts[p].ptr(r0 * padded + g * GROUP, (rows - 1) * padded + GROUP) };
                // SAFETY: a tile of `row_tiles` (16 rows only where this weight takes them); `at` spans
                // `(rows − 1) · padded + 16` floats of the output (checked by `ptr`), of which the tile writes
                // this group's columns, this task's alone.
                unsafe { part.run_rows((g, i), (r0, rows), (at, padded), tiles.as_ref(), &mut unpacked) };
            }
        }
    });
    drop(dsts);
    for (out, part) in outs.iter_mut().zip(parts) {
        let padded = part.n.div_ceil(GROUP) * GROUP;
        if padded != part.n {
            *out = out.chunks_exact(padded).flat_map(|row| &row[..part.n]).copied().collect();
        }
    }
    outs
}

/// Groups of 16 weight rows read at once when regrouping at load (a few megabytes at most).
const LOAD_GROUPS: usize = 128;

/// Regroups `n` stored rows of `row_bytes` (which `read` gives) into groups of 16 rows, `group_bytes` each:
/// `place(rows, group)` writes one group from its rows (16, or fewer in the last group), the groups of a read
/// in parallel. The regrouped tensor is the only full copy held.
pub fn regroup(
    n: usize,
    row_bytes: usize,
    group_bytes: usize,
    read: &mut RowReader,
    place: impl Fn(&[u8], &mut [u8]) + Sync,
) -> Result<Vec<u8>> {
    use rayon::prelude::*;
    let groups = n.div_ceil(GROUP);
    let mut out = vec![0u8; groups * group_bytes];
    for (batch, dst) in out.chunks_mut(LOAD_GROUPS * group_bytes).enumerate() {
        let first = batch * LOAD_GROUPS * GROUP;
        let rows = read(first..n.min(first + LOAD_GROUPS * GROUP))?;
        dst.par_chunks_mut(group_bytes)
            .zip(rows.par_chunks(GROUP * row_bytes))
            .for_each(|(group, rows)| place(rows, group));
    }
    Ok(out)
}

/// Gives the stored bytes of a range of weight rows (row-major, as in the file).
pub type RowReader<'a> = dyn FnMut(std::ops::Range<usize>) -> Result<Vec<u8>> + 'a;

/// The reader over a tensor already in memory, `row_bytes` per row.
pub fn rows_of(data: &[u8], row_bytes: usize) -> impl FnMut(std::ops::Range<usize>) -> Result<Vec<u8>> + '_ {
    move |rows| Ok(data[rows.start * row_bytes..rows.end * row_bytes].to_vec())
}
