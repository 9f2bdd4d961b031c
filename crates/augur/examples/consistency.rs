use augur::model::{self, ForwardOptions, LogitRows};
fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).unwrap();
    let dev = candle_core::Device::Cpu;
    let mut m = model::load(std::path::Path::new(&path), &dev)?.model;
    let ids: Vec<u32> = vec![1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712];
    let a = m.forward(&ids, &ForwardOptions::logits(LogitRows::All))?.logits.unwrap().to_vec2::<f32>()?;
    m.truncate(0);
    for (i, &t) in ids.iter().enumerate() {
        let b = m.forward(&[t], &ForwardOptions::logits(LogitRows::Last(1)))?.logits.unwrap().to_vec2::<f32>()?;
        let d = a[i].iter().zip(&b[0]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        println!("pos {i}: max diff {d}");
    }
    Ok(())
}
