use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
fn main() -> anyhow::Result<()> {
    let dev = Device::Cpu;
    for (dt, n, k) in [(GgmlDType::Q4_1, 1536usize, 576usize), (GgmlDType::Q4_1, 576, 1536), (GgmlDType::Q4_1, 192, 576), (GgmlDType::Q8_0, 49152, 576), (GgmlDType::Q4_1, 576, 576)] {
        let w = Tensor::randn(0f32, 1.0, (n, k), &dev)?;
        let q = QMatMul::from_qtensor(QTensor::quantize(&w, dt)?)?;
        let x = Tensor::randn(0f32, 1.0, (18, k), &dev)?;
        let all = q.forward(&x)?.to_vec2::<f32>()?;
        let mut worst = vec![];
        for m in [1usize, 2, 3, 4, 5, 8, 18] {
            let part = q.forward(&x.narrow(0, 0, m)?)?.to_vec2::<f32>()?;
            let d = (0..m).map(|i| all[i].iter().zip(&part[i]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)).fold(0f32, f32::max);
            worst.push((m, d));
        }
        println!("{dt:?} {n}x{k}: {worst:?}");
    }
    Ok(())
}
