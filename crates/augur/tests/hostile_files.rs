//! Crafted files of each hostile kind get a clear error naming the file and the field or tensor: never a panic, an
//! abort on allocation, a wrapped size or a path outside the model directory.

mod common;

use std::path::{Path, PathBuf};

use common::*;

/// A GGUF value as written to the file.
enum V {
    U32(u32),
    U64(u64),
    Str(&'static str),
    /// An array of u8 with a declared length that may differ from the elements given.
    Bytes(u64, Vec<u8>),
}

/// A GGUF v3 file: `kv` metadata, `tensors` as (name, dims fastest first, ggml type, offset), then `data`.
fn gguf(kv: &[(&str, V)], tensors: &[(&str, &[u64], u32, u64)], data: &[u8]) -> Vec<u8> {
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        s(&mut b, k);
        match v {
            V::U32(x) => {
                b.extend(4u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            V::U64(x) => {
                b.extend(10u32.to_le_bytes());
                b.extend(x.to_le_bytes());
            }
            V::Str(x) => {
                b.extend(8u32.to_le_bytes());
                s(&mut b, x);
            }
            V::Bytes(n, items) => {
                b.extend(9u32.to_le_bytes());
                b.extend(0u32.to_le_bytes());
                b.extend(n.to_le_bytes());
                b.extend(items);
            }
        }
    }
    for (name, dims, ty, offset) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
    }
    b.resize(b.len().next_multiple_of(32), 0);
    b.extend(data);
    b
}

/// A Llama config in GGUF metadata, with `overrides` replacing or adding entries.
fn llama_kv(overrides: Vec<(&'static str, V)>) -> Vec<(&'static str, V)> {
    let mut kv = vec![
        ("general.architecture", V::Str("llama")),
        ("llama.embedding_length", V::U32(64)),
        ("llama.feed_forward_length", V::U32(128)),
        ("llama.attention.head_count", V::U32(4)),
        ("llama.block_count", V::U32(2)),
        ("llama.vocab_size", V::U32(100)),
    ];
    for (k, v) in overrides {
        kv.retain(|(key, _)| *key != k);
        kv.push((k, v));
    }
    kv
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let f = dir.join(name);
    std::fs::write(&f, bytes).unwrap();
    f
}

#[test]
fn gguf_config_is_read_from_crafted_metadata() {
    // The crafted files below differ from this one in a single field; this one gets as far as the weights.
    let d = scratch("ok");
    let f = write(&d, "ok.gguf", &gguf(&llama_kv(vec![]), &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("ok.gguf") && e.contains("tensor `blk.0.attn_norm.weight` is missing"), "{e}");
}

#[test]
fn zero_alignment() {
    let d = scratch("align");
    let f = write(&d, "align.gguf", &gguf(&llama_kv(vec![("general.alignment", V::U32(0))]), &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("align.gguf") && e.contains("`general.alignment`") && e.contains("power of two"), "{e}");
}

#[test]
fn zero_heads() {
    let d = scratch("heads");
    let kv = llama_kv(vec![("llama.attention.head_count", V::U32(0)), ("llama.attention.key_length", V::U32(16))]);
    let f = write(&d, "heads.gguf", &gguf(&kv, &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("heads.gguf") && e.contains("llama.attention.head_count") && e.contains("positive"), "{e}");
}

#[test]
fn huge_layer_count() {
    let d = scratch("layers");
    let f = write(&d, "layers.gguf", &gguf(&llama_kv(vec![("llama.block_count", V::U64(1 << 40))]), &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("layers.gguf") && e.contains("llama.block_count") && e.contains("exceeds the limit"), "{e}");
}

#[test]
fn tensor_offset_that_would_wrap() {
    let d = scratch("wrap");
    // 32 f32 elements = 128 bytes at an offset 64 bytes short of 2^64: offset + size wraps to 64.
    let tensors: &[(&str, &[u64], u32, u64)] = &[("token_embd.weight", &[32], 0, u64::MAX - 63)];
    let f = write(&d, "wrap.gguf", &gguf(&llama_kv(vec![]), tensors, &[0; 256]));
    let e = load_err(&f);
    assert!(e.contains("wrap.gguf") && e.contains("truncated: tensor `token_embd.weight`"), "{e}");
}

#[test]
fn tensor_shape_that_overflows() {
    let d = scratch("shape");
    let tensors: &[(&str, &[u64], u32, u64)] = &[("token_embd.weight", &[1 << 32, 1 << 32, 1 << 32], 0, 0)];
    let f = write(&d, "shape.gguf", &gguf(&llama_kv(vec![]), tensors, &[]));
    let e = load_err(&f);
    assert!(e.contains("shape.gguf") && e.contains("`token_embd.weight`") && e.contains("64 bits"), "{e}");
}

#[test]
fn array_longer_than_the_file() {
    let d = scratch("array");
    let kv = llama_kv(vec![("tokenizer.ggml.token_type", V::Bytes(1 << 40, vec![1; 8]))]);
    let f = write(&d, "array.gguf", &gguf(&kv, &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("array.gguf") && e.contains("`tokenizer.ggml.token_type`") && e.contains("limit"), "{e}");
    let kv = llama_kv(vec![("tokenizer.ggml.token_type", V::Bytes(1 << 20, vec![1; 8]))]);
    let f = write(&d, "short.gguf", &gguf(&kv, &[], &[]));
    let e = load_err(&f);
    assert!(e.contains("short.gguf") && e.contains("`tokenizer.ggml.token_type`") && e.contains("truncated"), "{e}");
}

#[test]
fn arrays_that_would_take_too_much_memory() {
    // Each u8 on disk is a 32-byte value in memory: 16 MiB of them would take 512 MiB, refused before allocating.
    let n = 1u64 << 24;
    let kv = vec![("general.architecture", V::Str("llama")), ("a", V::Bytes(n, vec![0; n as usize]))];
    let e = augur::fuzzing::gguf_config(&gguf(&kv, &[], &[])).unwrap_err().to_string();
    assert!(e.contains("metadata `a`") && e.contains("bytes of memory"), "{e}");
}

#[test]
fn duplicate_metadata_key() {
    let mut kv = llama_kv(vec![]);
    kv.push(("llama.block_count", V::U32(3)));
    let e = augur::fuzzing::gguf_config(&gguf(&kv, &[], &[])).unwrap_err().to_string();
    assert!(e.contains("`llama.block_count` appears twice"), "{e}");
}

fn config_dir(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let d = scratch(name);
    let text = std::fs::read_to_string(fixtures().join("tiny-llama/config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut json);
    std::fs::write(d.join("config.json"), json.to_string()).unwrap();
    d
}

#[test]
fn config_json_zero_heads_with_explicit_head_dim() {
    let d = config_dir("cfg-heads", |j| {
        j["num_attention_heads"] = 0.into();
        j["head_dim"] = 16.into();
    });
    let e = load_err(&d);
    assert!(e.contains("config.json") && e.contains("num_attention_heads") && e.contains("positive"), "{e}");
}

#[test]
fn config_json_huge_layer_count() {
    let d = config_dir("cfg-layers", |j| j["num_hidden_layers"] = (1u64 << 40).into());
    let e = load_err(&d);
    assert!(e.contains("config.json") && e.contains("num_hidden_layers") && e.contains("exceeds the limit"), "{e}");
}

#[test]
fn shard_paths_outside_the_model_directory() {
    for (name, shard) in [("dotdot", "../outside.safetensors"), ("absolute", "/etc/passwd"), ("empty", "")] {
        let d = scratch(&format!("shard-{name}"));
        std::fs::copy(fixtures().join("tiny-llama/config.json"), d.join("config.json")).unwrap();
        let index = serde_json::json!({ "weight_map": { "model.embed_tokens.weight": shard } });
        std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
        let e = load_err(&d);
        assert!(
            e.contains("model.safetensors.index.json")
                && e.contains("`weight_map.model.embed_tokens.weight`")
                && e.contains("not a file name inside the model directory"),
            "{name}: {e}"
        );
    }
}

#[test]
fn sentencepiece_tokens_too_long_to_derive_merges() {
    // "a", "aa", … : every split of every token is a merge, so the work grows with the cube of the count.
    let n = 1200;
    let tokens: Vec<String> = (1..=n).map(|k| "a".repeat(k)).collect();
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    let s = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    s(&mut b, "tokenizer.ggml.model");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "llama");
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    for t in &tokens {
        s(&mut b, t);
    }
    s(&mut b, "tokenizer.ggml.scores");
    b.extend(9u32.to_le_bytes());
    b.extend(6u32.to_le_bytes());
    b.extend((n as u64).to_le_bytes());
    for k in 0..n {
        b.extend((-(k as f32)).to_le_bytes());
    }
    let e = augur::fuzzing::gguf_tokenizer(&b).unwrap_err().to_string();
    assert!(e.contains("`tokenizer.ggml.tokens`") && e.contains("too long"), "{e}");
}

#[test]
fn the_gguf_reader_reads_real_files_as_candle_does() {
    use augur::io::gguf;
    use candle_core::quantized::gguf_file::Content;
    let files = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct.gguf"];
    for name in files {
        let path = real_model(name);
        let mut f = std::fs::File::open(&path).unwrap();
        let theirs = Content::read(&mut f).unwrap();
        let len = f.metadata().unwrap().len();
        let ours = gguf::read(&mut std::io::BufReader::new(std::fs::File::open(&path).unwrap()), len, &path).unwrap();
        assert_eq!(ours.tensor_data_offset, theirs.tensor_data_offset, "{name}");
        assert_eq!(ours.metadata.len(), theirs.metadata.len(), "{name}");
        for (k, v) in &theirs.metadata {
            assert_eq!(format!("{:?}", ours.metadata[k]), format!("{v:?}"), "{name}: {k}");
        }
        assert_eq!(ours.tensor_infos.len(), theirs.tensor_infos.len(), "{name}");
        for (k, t) in &theirs.tensor_infos {
            let o = &ours.tensor_infos[k];
            assert_eq!(
                (o.ggml_dtype, o.shape.dims(), o.offset),
                (t.ggml_dtype, t.shape.dims(), t.offset),
                "{name}: {k}"
            );
        }
    }
}

#[test]
fn nan_sentencepiece_score() {
    // Found by the gguf_tokenizer fuzz target: a NaN score made the merge sort panic (not a total order).
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions/gguf_tokenizer/nan-score-breaks-the-merge-sort");
    let e = augur::fuzzing::gguf_tokenizer(&std::fs::read(path).unwrap()).unwrap_err().to_string();
    assert!(e.contains("`tokenizer.ggml.scores`[") && e.contains("is NaN"), "{e}");
}
