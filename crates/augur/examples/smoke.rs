use augur::model::{self, ForwardOptions, LogitRows};
use candle_core::quantized::tokenizer::TokenizerFromGguf;
fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap();
    let dev = candle_core::Device::Cpu;
    let t0 = std::time::Instant::now();
    let mut m = model::load(std::path::Path::new(&path), &dev)?;
    eprintln!("load {:?} {:?}", t0.elapsed(), m.model.config());
    let tok = tokenizers::Tokenizer::from_gguf(m.gguf.as_ref().unwrap())?;
    let prompt = std::env::args().nth(2).unwrap_or("The capital of France is".into());
    let ids = tok.encode(prompt.as_str(), false).map_err(anyhow::Error::msg)?.get_ids().to_vec();
    eprintln!("ids {ids:?}");
    let mut toks = ids.clone();
    let t0 = std::time::Instant::now();
    let mut out = m.model.forward(&ids, &ForwardOptions::logits(LogitRows::Last))?;
    eprintln!("prefill {:?}", t0.elapsed());
    let t0 = std::time::Instant::now();
    let n = 32;
    for _ in 0..n {
        let l: Vec<f32> = out.logits.unwrap().squeeze(0)?.to_vec1()?;
        let next = l.iter().enumerate().max_by(|a, b| a.1.partial_cmp(b.1).unwrap().then(b.0.cmp(&a.0))).unwrap().0 as u32;
        toks.push(next);
        out = m.model.forward(&[next], &ForwardOptions::logits(LogitRows::Last))?;
    }
    let dt = t0.elapsed();
    eprintln!("decode {:.1} tok/s", n as f64 / dt.as_secs_f64());
    println!("{}", tok.decode(&toks, false).map_err(anyhow::Error::msg)?);
    Ok(())
}
