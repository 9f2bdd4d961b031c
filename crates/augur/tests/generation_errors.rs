//! Generation that cannot go on honestly stops with an error naming the problem: NaN or infinite logits (naming
//! the model's file and the position), an empty stop string.

mod common;

use std::path::{Path, PathBuf};

use augur::generation::config::GenerationOptions;
use augur::pipeline::{LoadedLm, Pipeline};
use common::*;
use safetensors::tensor::TensorView;

/// A copy of fixture `name` in a scratch directory whose `lm_head.weight` row `token` is `value`: that token's
/// logit is then `value`-poisoned at every position.
fn poisoned(name: &str, token: usize, value: f32) -> PathBuf {
    let dir = scratch(&format!("poisoned-{name}-{value}"));
    for f in std::fs::read_dir(fixtures().join(name)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<u8>, safetensors::Dtype, Vec<usize>)> =
        st.tensors().into_iter().map(|(n, t)| (n, t.data().to_vec(), t.dtype(), t.shape().to_vec())).collect();
    let (_, data, dtype, shape) = tensors.iter_mut().find(|(n, ..)| n == "lm_head.weight").expect("an untied LM head");
    assert_eq!(*dtype, safetensors::Dtype::F32);
    let hidden = shape[1];
    data[token * hidden * 4..(token * hidden + 1) * 4].copy_from_slice(&value.to_le_bytes());
    let views: Vec<(String, TensorView)> =
        tensors.iter().map(|(n, d, t, s)| (n.clone(), TensorView::new(*t, s.clone(), d).unwrap())).collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    dir
}

fn loaded(path: &Path) -> LoadedLm {
    load(path, false)
}

#[test]
fn nan_logits_of_the_target_name_its_file_and_the_position() {
    for value in [f32::NAN, f32::INFINITY] {
        let dir = poisoned("tiny-llama", 5, value);
        let mut pipe = Pipeline { target: loaded(&dir), assistant: None, defaults: GenerationOptions::default() };
        let prompt = [3, 4, 5, 6];
        let e = pipe.generate_ids(&prompt, &greedy(4), None).unwrap_err().to_string();
        assert!(e.contains("the target model") && e.contains(&dir.display().to_string()), "{e}");
        assert!(e.contains("token id 5") && e.contains("at position 3"), "{e}");
        // The same under speculation: the verification forward's rows.
        let opts =
            GenerationOptions { prompt_lookup_num_tokens: Some(3), cost_aware_drafting: Some(false), ..greedy(4) };
        let e = pipe.generate_ids(&[3, 4, 3, 4], &opts, None).unwrap_err().to_string();
        assert!(e.contains("the target model") && e.contains("token id 5"), "{e}");
    }
}

#[test]
fn nan_logits_of_the_assistant_name_its_file() {
    let dir = poisoned("tiny-llama-assistant", 7, f32::NAN);
    let mut pipe = Pipeline {
        target: loaded(&fixtures().join("tiny-llama")),
        assistant: Some(augur::pipeline::Assistant::Lm(loaded(&dir))),
        defaults: GenerationOptions::default(),
    };
    let opts = GenerationOptions { num_assistant_tokens: Some(3), cost_aware_drafting: Some(false), ..greedy(4) };
    let e = pipe.generate_ids(&[3, 4, 5, 6], &opts, None).unwrap_err().to_string();
    assert!(e.contains("the assistant model") && e.contains(&dir.display().to_string()), "{e}");
    assert!(e.contains("token id 7") && e.contains("at position 3"), "{e}");
}

#[test]
fn an_empty_stop_string_is_refused() {
    let mut pipe = pipeline("tiny-llama", None);
    let opts = GenerationOptions { stop_strings: Some(vec!["x".into(), String::new()]), ..greedy(4) };
    let e = pipe.generate_ids(&[3, 4, 5], &opts, None).unwrap_err().to_string();
    assert!(e.contains("`stop_strings` must not contain an empty string"), "{e}");
}
