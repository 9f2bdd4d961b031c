//! Bit-identical logits on every weight path: each GGUF type's own kernel, candle's quantized fallback, dense
//! f32/f16/bf16 safetensors, float GGUF tensors and the dequantized load. A position's logits are the same
//! bits computed alone (one row after the cache), inside a block of 2 to 16 rows, and inside a batched forward
//! of several sequences: what makes greedy speculation equal to plain greedy decoding, token for token.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use augur::models::{Architecture, CausalLm, ForwardOptions, LoadOptions, LogitRows};
use augur::{io::weights::Weights, nn::LinearPath};
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use common::{fixtures, real_model};

/// Each row's logits as bits.
type Bits = Vec<Vec<u32>>;

fn forward_bits(m: &mut dyn CausalLm, tokens: &[u32]) -> Bits {
    let logits = m.forward(tokens, &ForwardOptions::logits(LogitRows::All)).unwrap().logits.unwrap();
    logits.to_vec2::<f32>().unwrap().into_iter().map(|r| r.into_iter().map(f32::to_bits).collect()).collect()
}

/// Token ids below `vocab` from a xorshift generator.
fn tokens(seed: u64, vocab: u32, n: usize) -> Vec<u32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

/// Where two rows of logits first differ, and by how much, for a failure message.
fn first_difference(a: &[u32], b: &[u32]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!("logit {i}: {} vs {}", f32::from_bits(a[i]), f32::from_bits(b[i])),
        None => format!("{} vs {} logits", a.len(), b.len()),
    }
}

/// Positions fed before the positions compared.
const PREFIX: usize = 7;
/// Positions compared after the prefix: a block of 16 starting up to 3 positions in.
const AFTER: usize = 19;

/// Every position after a prefix decoded one at a time, then recomputed inside blocks of each of `sizes` rows
/// (at most 16, each starting 0 to 3 positions after the prefix, those fed one at a time): the same bits.
fn blocks_equal_alone(what: &str, lm: &dyn CausalLm, sizes: impl IntoIterator<Item = usize>) {
    let seq = tokens(0x9e37_79b9, lm.config().vocab_size as u32, PREFIX + AFTER);
    let mut alone = lm.fork().unwrap();
    forward_bits(alone.as_mut(), &seq[..PREFIX]);
    let singles: Bits = (PREFIX..PREFIX + AFTER).flat_map(|p| forward_bits(alone.as_mut(), &seq[p..p + 1])).collect();
    assert!(singles.windows(2).all(|w| w[0] != w[1]), "{what}: positions must get logits of their own");
    let mut m = lm.fork().unwrap();
    forward_bits(m.as_mut(), &seq[..PREFIX]);
    for b in sizes {
        let o = b % 4;
        m.truncate(PREFIX);
        for p in PREFIX..PREFIX + o {
            assert_eq!(forward_bits(m.as_mut(), &seq[p..p + 1])[0], singles[p - PREFIX], "{what}: position {p} alone");
        }
        let start = PREFIX + o;
        let block = forward_bits(m.as_mut(), &seq[start..start + b]);
        assert_eq!(block.len(), b, "{what}: a block of {b} rows");
        for (r, row) in block.iter().enumerate() {
            assert!(
                row == &singles[o + r],
                "{what}: row {r} of a block of {b} (position {}) differs from the position alone: {}",
                start + r,
                first_difference(row, &singles[o + r])
            );
        }
    }
}

/// Forks on four threads, each feeding its own sequence in blocks of its own sizes at the same time (the
/// batcher merges their forwards): every position gets the bits it gets alone, decoded one at a time.
fn batched_equal_alone(what: &str, lm: &dyn CausalLm) {
    let schedules: [&[usize]; 4] =
        [&[1, 3, 1, 5, 2, 1, 1], &[2, 1, 4, 1, 1, 3, 1], &[1, 1, 6, 2, 1, 1], &[3, 2, 1, 1, 4, 1]];
    let vocab = lm.config().vocab_size as u32;
    let seqs: Vec<(usize, Vec<u32>)> = schedules
        .iter()
        .enumerate()
        .map(|(i, s)| (4 + i, tokens(17 + i as u64, vocab, 4 + i + s.iter().sum::<usize>())))
        .collect();
    let expected: Vec<Bits> = seqs
        .iter()
        .map(|(prefix, seq)| {
            let mut m = lm.fork().unwrap();
            let mut rows = forward_bits(m.as_mut(), &seq[..*prefix]);
            rows.extend((*prefix..seq.len()).flat_map(|p| forward_bits(m.as_mut(), &seq[p..p + 1])));
            rows
        })
        .collect();
    let before = lm.batched_forwards();
    let barrier = Arc::new(Barrier::new(seqs.len()));
    let handles: Vec<_> = seqs
        .iter()
        .zip(schedules)
        .map(|((prefix, seq), schedule)| {
            let (mut m, barrier, seq, prefix) = (lm.fork().unwrap(), Arc::clone(&barrier), seq.clone(), *prefix);
            std::thread::spawn(move || {
                barrier.wait();
                let mut rows = forward_bits(m.as_mut(), &seq[..prefix]);
                let mut at = prefix;
                for &b in schedule {
                    rows.extend(forward_bits(m.as_mut(), &seq[at..at + b]));
                    at += b;
                }
                rows
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let rows = h.join().unwrap();
        assert_eq!(rows.len(), expected[i].len(), "{what}: sequence {i}");
        for (p, (got, want)) in rows.iter().zip(&expected[i]).enumerate() {
            assert!(got == want, "{what}: sequence {i} position {p} batched: {}", first_difference(got, want));
        }
    }
    let batched = lm.batched_forwards() - before;
    let forwards: usize = schedules.iter().map(|s| s.len() + 1).sum();
    assert!(batched >= 8, "{what}: only {batched} of {forwards} forwards ran batched with another sequence's");
}

fn load(path: &Path, dequantize: bool) -> Box<dyn CausalLm> {
    augur::models::load(path, &Device::Cpu, &LoadOptions { dequantize, ..Default::default() }, |_| Ok(()))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .0
        .model
}

/// A fresh directory for this test's generated models.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bits").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `tiny-llama` with every tensor stored as `dtype`.
fn tiny_llama_as(dtype: DType) -> PathBuf {
    let src = fixtures().join("tiny-llama");
    let dir = scratch(&format!("tiny-llama-{dtype:?}"));
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let tensors: HashMap<String, Tensor> = candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(k, t)| (k, t.to_dtype(dtype).unwrap()))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    dir
}

/// A random llama-shaped model whose every product runs on a weight of `dtype`: its dimensions are multiples
/// of 256 (K-type super-blocks) and its LM head is its own tensor.
struct Generated;

impl Generated {
    const HIDDEN: usize = 256;
    /// Past 512, where the dense product cuts its sums into chunks.
    const FFN: usize = 768;
    const HEADS: usize = 4;
    const KV_HEADS: usize = 2;
    const HEAD_DIM: usize = 64;
    const VOCAB: usize = 512;
    const LAYERS: usize = 2;

    /// Written under `test`'s own directory: two tests running at once write the same type.
    fn write(test: &str, dtype: GgmlDType) -> PathBuf {
        let path = scratch(&format!("{test}/gen-{dtype:?}")).join("model.gguf");
        let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ dtype as u64;
        let mut values = |n: usize, scale: f32, mean: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    mean + scale * ((seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                })
                .collect()
        };
        let (h, f, kv) = (Self::HIDDEN, Self::FFN, Self::KV_HEADS * Self::HEAD_DIM);
        let mut tensors: Vec<(String, QTensor)> = Vec::new();
        let mut matrix = |name: String, rows: usize, cols: usize, values: Vec<f32>| {
            let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
            tensors.push((name, QTensor::quantize(&t, dtype).unwrap()));
        };
        let mut norms: Vec<(String, Vec<f32>)> = Vec::new();
        matrix("token_embd.weight".into(), Self::VOCAB, h, values(Self::VOCAB * h, 1.0, 0.0));
        matrix("output.weight".into(), Self::VOCAB, h, values(Self::VOCAB * h, 0.2, 0.0));
        norms.push(("output_norm.weight".into(), values(h, 0.1, 1.0)));
        for l in 0..Self::LAYERS {
            let s = 1.5 / (h as f32).sqrt();
            for (name, rows, cols) in [
                ("attn_q", h, h),
                ("attn_k", kv, h),
                ("attn_v", kv, h),
                ("attn_output", h, h),
                ("ffn_gate", f, h),
                ("ffn_up", f, h),
                ("ffn_down", h, f),
            ] {
                matrix(format!("blk.{l}.{name}.weight"), rows, cols, values(rows * cols, s, 0.0));
            }
            norms.push((format!("blk.{l}.attn_norm.weight"), values(h, 0.1, 1.0)));
            norms.push((format!("blk.{l}.ffn_norm.weight"), values(h, 0.1, 1.0)));
        }
        for (name, v) in norms {
            let t = Tensor::from_vec(v, h, &Device::Cpu).unwrap();
            tensors.push((name, QTensor::quantize(&t, GgmlDType::F32).unwrap()));
        }
        use gguf_file::Value;
        let metadata: Vec<(&str, Value)> = vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.embedding_length", Value::U32(h as u32)),
            ("llama.feed_forward_length", Value::U32(f as u32)),
            ("llama.attention.head_count", Value::U32(Self::HEADS as u32)),
            ("llama.attention.head_count_kv", Value::U32(Self::KV_HEADS as u32)),
            ("llama.block_count", Value::U32(Self::LAYERS as u32)),
            ("llama.vocab_size", Value::U32(Self::VOCAB as u32)),
            ("llama.context_length", Value::U32(256)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("llama.rope.freq_base", Value::F32(10_000.0)),
        ];
        let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let mut file = std::fs::File::create(&path).unwrap();
        gguf_file::write(&mut file, &metadata, &tensors).unwrap();
        path
    }

    /// The product the loader builds for this file's `ffn_up` and LM head, with or without dequantizing.
    fn paths(path: &Path, dequantize: bool) -> [LinearPath; 2] {
        let mut w = Weights::open_gguf(path, &Device::Cpu).unwrap();
        w.dequantize = dequantize;
        let up = w.linear("model.layers.1.mlp.up_proj", Self::FFN, Self::HIDDEN, false).unwrap();
        let head = w.linear("lm_head", Self::VOCAB, Self::HIDDEN, false).unwrap();
        [up.path(), head.path()]
    }
}

/// Both checks on one loaded model.
fn check(what: &str, lm: &dyn CausalLm) {
    blocks_equal_alone(what, lm, 2..=16);
    batched_equal_alone(what, lm);
}

/// The product this machine runs for a weight of quantized `dtype`: ours on AVX-512 VNNI or on AVX2 with FMA
/// and F16C (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, the same bits on both), candle's otherwise.
fn expected_path(dtype: GgmlDType) -> LinearPath {
    use GgmlDType::*;
    let mut own: &[GgmlDType] = &[];
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            own = &[Q4_0, Q4_1, Q5_0, Q8_0, Q4K, Q6K];
        }
    }
    if own.contains(&dtype) {
        LinearPath::Own(dtype)
    } else {
        LinearPath::Candle(dtype)
    }
}

/// Every quantized type the loader takes: the six with kernels of ours where this machine runs them (the
/// 32-element blocks in `qkernels`, the super-blocks in `kquants`), and Q5_1, Q2_K, Q3_K, Q5_K on candle's.
#[test]
fn quantized_types_give_every_row_its_bits() {
    use GgmlDType::*;
    for dtype in [Q4_0, Q4_1, Q5_0, Q8_0, Q4K, Q6K, Q5_1, Q2K, Q3K, Q5K] {
        let path = Generated::write("quantized", dtype);
        let expected = expected_path(dtype);
        assert_eq!(Generated::paths(&path, false), [expected; 2]);
        check(&format!("{expected:?}"), load(&path, false).as_ref());
    }
}

/// Dense products: float GGUF tensors and a dequantized load of a quantized file.
#[test]
fn dense_gguf_and_dequantized_give_every_row_its_bits() {
    for dtype in [GgmlDType::F32, GgmlDType::F16, GgmlDType::BF16] {
        let path = Generated::write("dense", dtype);
        assert_eq!(Generated::paths(&path, false), [LinearPath::Dense; 2]);
        check(&format!("GGUF {dtype:?}"), load(&path, false).as_ref());
    }
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q6K] {
        let path = Generated::write("dequantized", dtype);
        assert_eq!(Generated::paths(&path, true), [LinearPath::Dense; 2]);
        check(&format!("dequantized {dtype:?}"), load(&path, true).as_ref());
    }
}

/// Dense safetensors, multiplied in their own type (`kernels::dense`): the tiny fixtures in f32 (the
/// mixture-of-experts one routes a block's rows to experts in groups that change with the block), and
/// tiny-llama converted to f16 and bf16.
#[test]
fn dense_safetensors_give_every_row_its_bits() {
    for name in ["tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-deepseek-v3-mtp"] {
        check(name, load(&fixtures().join(name), false).as_ref());
    }
    for dtype in [DType::F16, DType::BF16] {
        let dir = tiny_llama_as(dtype);
        let w = Weights::open_safetensors(&dir, Architecture::Llama, &Device::Cpu).unwrap();
        assert_eq!(w.dtype_summary().keys().collect::<Vec<_>>(), [&format!("{dtype:?}")]);
        let own = if dtype == DType::F16 { GgmlDType::F16 } else { GgmlDType::BF16 };
        assert_eq!(w.linear("model.layers.0.mlp.up_proj", 128, 64, false).unwrap().path(), LinearPath::Own(own));
        check(&format!("tiny-llama {dtype:?}"), load(&dir, false).as_ref());
    }
}

/// The real files at their own sizes (more than one 16-row group, long LM heads, the pool in use): SmolLM2's
/// Q4_1 with its Q8_0 tied head, and Gemma 3 270M's Q5_0, Q4_K, Q6_K and Q8_0 (in a few block sizes: each of
/// its rows takes a 262144-row LM head).
#[test]
fn real_models_give_every_row_its_bits() {
    let smollm2 = real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let gemma = real_model("gemma-3-270m-q4_k_m.gguf");
    let w = Weights::open_gguf(&smollm2, &Device::Cpu).unwrap();
    let paths = [
        w.linear("model.layers.0.mlp.up_proj", 1536, 576, false).unwrap().path(),
        w.linear("model.embed_tokens", 49152, 576, false).unwrap().path(),
    ];
    assert_eq!(paths, [expected_path(GgmlDType::Q4_1), expected_path(GgmlDType::Q8_0)]);
    check("SmolLM2 Q4_1", load(&smollm2, false).as_ref());
    let w = Weights::open_gguf(&gemma, &Device::Cpu).unwrap();
    let mut paths: Vec<LinearPath> = (0..18)
        .flat_map(|l| {
            let p = format!("model.layers.{l}");
            [
                w.linear(&format!("{p}.self_attn.v_proj"), 256, 640, false).unwrap().path(),
                w.linear(&format!("{p}.mlp.down_proj"), 640, 2048, false).unwrap().path(),
                w.linear(&format!("{p}.mlp.up_proj"), 2048, 640, false).unwrap().path(),
            ]
        })
        .collect();
    paths.sort_by_key(|p| format!("{p:?}"));
    paths.dedup();
    let mut expected = [GgmlDType::Q4K, GgmlDType::Q5_0, GgmlDType::Q6K, GgmlDType::Q8_0].map(expected_path);
    expected.sort_by_key(|p| format!("{p:?}"));
    assert_eq!(paths, expected, "Gemma 3 270M's products");
    blocks_equal_alone("Gemma 3 270M Q4_K_M", load(&gemma, false).as_ref(), [2, 5, 16]);
}
