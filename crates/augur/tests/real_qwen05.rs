//! Qwen2.5-Coder-0.5B-Instruct from its GGUF file (fetched by `.ci/run`): the configuration read from the
//! file's tensor table (q/k/v biases, an LM head of its own), and a continuation that only a correctly
//! built model gives. Without the biases the model still runs, and speculation stays lossless against it, but
//! it writes noise.

mod common;

use augur::models::{ForwardOptions, LogitRows};
use common::{load, real_model};

const FILE: &str = "qwen2.5-coder-0.5b-instruct.gguf";

#[test]
fn gguf_config_reads_the_tensor_table() {
    let mut lm = load(&real_model(FILE), false);
    let cfg = lm.model.config();
    assert!(cfg.attention_bias, "the file has blk.0.attn_q.bias");
    assert!(!cfg.tie_word_embeddings, "the file has an output.weight of its own");
    let ids = lm.tokenizer.encode("The capital of France is", false).unwrap();
    let out = lm.model.forward(&ids, &ForwardOptions::logits(LogitRows::Last(1))).unwrap();
    let l = out.logits.unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let best = (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap() as u32;
    assert_eq!(lm.tokenizer.decode(&[best], false).unwrap(), " Paris");
}
