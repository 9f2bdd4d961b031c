//! Times one quantized product `[m, k] · [n, k]ᵀ` through augur's own kernels for each type they take: the best of
//! 20 runs on the thread pool. Run it twice, with and without `AUGUR_AMX=off`, to compare AMX tiles with VNNI:
//!
//! ```text
//! cargo run --release -p augur --example products -- N K M
//! AUGUR_AMX=off cargo run --release -p augur --example products -- N K M
//! ```

use std::time::Instant;

use anyhow::{bail, Context};
use augur::kernels::quant::{blocks32::BlockMatrix, kquants::SuperBlockMatrix, QuantKernel};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

fn main() -> anyhow::Result<()> {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse()).collect::<Result<_, _>>()?;
    let [n, k, m] = args[..] else { bail!("usage: products N K M (weight rows, columns, activation rows)") };
    let values: Vec<f32> = (0..n * k).map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0).collect();
    let weights = Tensor::from_vec(values, (n, k), &Device::Cpu)?;
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 13 % 29) as f32 / 14.0 - 1.0) * 0.5).collect();
    let types = [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q5_0, GgmlDType::Q8_0, GgmlDType::Q4K, GgmlDType::Q6K];
    for dtype in types {
        let super_block = matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K);
        if super_block && !k.is_multiple_of(256) {
            continue;
        }
        let q = QTensor::quantize(&weights, dtype)?;
        let kernel: Box<dyn QuantKernel> = if super_block {
            Box::new(SuperBlockMatrix::from_qtensor(&q)?.context("no K-type kernel on this CPU")?)
        } else {
            Box::new(BlockMatrix::from_qtensor(&q)?.context("no block kernel on this CPU")?)
        };
        let mut best = f64::MAX;
        for _ in 0..20 {
            let start = Instant::now();
            std::hint::black_box(augur::kernels::parallel::on_pool(|| kernel.matmul_first(&x, m, n)));
            best = best.min(start.elapsed().as_secs_f64());
        }
        let macs = (n * k * m) as f64 / best / 1e9;
        println!("{dtype:?} [{n} x {k}] x {m} rows: {:.3} ms, {macs:.1} GMAC/s", best * 1e3);
    }
    Ok(())
}
