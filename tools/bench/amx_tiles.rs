//! The AMX tile loop of a 1536 x 1536 x 512 int8 product on one core, stand-alone: per 16 x 16 x 32 block, two tile
//! loads, `tilezero`, `tdpbssd` and `tilestored`, alone and followed by the 16-row float scaling the kernels do
//! after each block (two blocks on two sets of tiles, or 2 x 2 tiles sharing their loads). Linux x86-64 with AMX only.
//!
//!   rustc -O -C target-cpu=native tools/bench/amx_tiles.rs -o /tmp/amx_tiles && taskset -c 1 /tmp/amx_tiles
use std::arch::asm;
use std::arch::x86_64::*;
use std::time::Instant;
#[repr(C, align(64))]
struct Cfg { palette: u8, start: u8, r: [u8; 14], colsb: [u16; 16], rows: [u8; 16], pad: [u8;16] }
#[inline(always)]
unsafe fn epi(src: *const i32, acc: &mut [__m512; 16], dd: *const f32) {
    let sc = _mm512_set1_ps(1.0001);
    for r in 0..16 {
        let v = _mm512_cvtepi32_ps(_mm512_loadu_si512(src.add(16*r) as *const _));
        acc[r] = _mm512_fmadd_ps(v, _mm512_mul_ps(sc, _mm512_set1_ps(*dd.add(r))), acc[r]);
    }
}
#[target_feature(enable="avx512f")]
unsafe fn pairs(epilogue: bool, a: &[i8], b: &[i8], k: usize, nb: usize, nt: usize, ng: usize) -> f64 {
    let mut buf = vec![[0i32; 256]; 8];
    let mut acc = [_mm512_setzero_ps(); 16];
    let dd = [0.5f32; 16].as_ptr();
    let t0 = Instant::now();
    for g in 0..ng { for t in 0..nt { for bb in (0..nb).step_by(2) {
        let a0 = a.as_ptr().add(t*16*k + bb*32);
        let b0 = b.as_ptr().add(g*nb*512 + bb*512); let o = buf[bb%8].as_mut_ptr();
        asm!("tileloadd tmm0, [{a0} + {sa}*1]", "tileloadd tmm2, [{b0} + {sb}*1]", "tilezero tmm4", "tdpbssd tmm4, tmm0, tmm2",
             "tileloadd tmm1, [{a1} + {sa}*1]", "tileloadd tmm3, [{b1} + {sb}*1]", "tilezero tmm5", "tdpbssd tmm5, tmm1, tmm3",
             "tilestored [{c0} + {sc}*1], tmm4", "tilestored [{c1} + {sc}*1], tmm5",
             a0 = in(reg) a0, a1 = in(reg) a0.add(32), sa = in(reg) k, b0 = in(reg) b0, b1 = in(reg) b0.add(512), sb = in(reg) 64usize, c0 = in(reg) o, c1 = in(reg) o.add(256), sc = in(reg) 64usize);
        if epilogue {
            epi(buf[(bb + 4) % 8].as_ptr() as *const i32, &mut acc, dd);
            epi(buf[(bb + 5) % 8].as_ptr() as *const i32, &mut acc, dd);
        }
    }}}
    let e = t0.elapsed().as_secs_f64();
    let mut s = 0f32; for r in 0..16 { s += _mm512_reduce_add_ps(acc[r]); } std::hint::black_box(s);
    e*1e9/(ng*nt*nb) as f64
}
#[target_feature(enable="avx512f")]
unsafe fn two_by_two(a: &[i8], b: &[i8], k: usize, nb: usize, nt: usize, ng: usize) -> f64 {
    let mut buf = vec![[0i32; 256]; 8];
    let mut acc = [[_mm512_setzero_ps(); 16]; 4];
    let dd = [0.5f32; 16].as_ptr();
    let t0 = Instant::now();
    for g in (0..ng).step_by(2) { for t in (0..nt).step_by(2) { for bb in 0..nb {
        let a0 = a.as_ptr().add(t*16*k + bb*32);
        let b0 = b.as_ptr().add(g*nb*512 + bb*512); let o = buf[(bb%2)*4].as_mut_ptr();
        asm!("tileloadd tmm0, [{a0} + {sa}*1]", "tileloadd tmm2, [{b0} + {sb}*1]", "tilezero tmm4", "tdpbssd tmm4, tmm0, tmm2",
             "tileloadd tmm3, [{b1} + {sb}*1]", "tilezero tmm5", "tdpbssd tmm5, tmm0, tmm3",
             "tileloadd tmm1, [{a1} + {sa}*1]", "tilezero tmm6", "tdpbssd tmm6, tmm1, tmm2",
             "tilezero tmm7", "tdpbssd tmm7, tmm1, tmm3",
             "tilestored [{c0} + {sc}*1], tmm4", "tilestored [{c1} + {sc}*1], tmm5",
             "tilestored [{c2} + {sc}*1], tmm6", "tilestored [{c3} + {sc}*1], tmm7",
             a0 = in(reg) a0, a1 = in(reg) a0.add(16*k), sa = in(reg) k, b0 = in(reg) b0, b1 = in(reg) b0.add(nb*512), sb = in(reg) 64usize,
             c0 = in(reg) o, c1 = in(reg) o.add(256), c2 = in(reg) o.add(512), c3 = in(reg) o.add(768), sc = in(reg) 64usize);
        let prev = ((bb+1)%2)*4;
        for q in 0..4 { epi(buf[prev+q].as_ptr() as *const i32, &mut acc[q], dd); }
    }}}
    let e = t0.elapsed().as_secs_f64();
    let mut s = 0f32; for q in 0..4 { for r in 0..16 { s += _mm512_reduce_add_ps(acc[q][r]); }} std::hint::black_box(s);
    e*1e9/(ng*nt*nb) as f64
}
fn main() {
    unsafe { let r: i64; asm!("syscall", inlateout("rax") 158i64 => r, in("rdi") 0x1023i64, in("rsi") 18i64, lateout("rcx") _, lateout("r11") _); assert_eq!(r,0); }
    let mut c = Cfg { palette: 1, start: 0, r: [0;14], colsb: [0;16], rows: [0;16], pad: [0;16] };
    for (t,(cb,r)) in [(32,16),(32,16),(64,8),(64,8),(64,16),(64,16),(64,16),(64,16)].iter().enumerate() { c.colsb[t]=*cb; c.rows[t]=*r; }
    let k = 1536usize; let nb = k/32; let m = 512; let n = 1536;
    let a: Vec<i8> = vec![1; m*k];
    let b: Vec<i8> = vec![1; n*k];
    unsafe { asm!("ldtilecfg [{}]", in(reg) &c); }
    unsafe { for _ in 0..2 {
        println!("tiles only, pairs: {:.2} ns/block", pairs(false, &a, &b, k, nb, m/16, n/16));
        println!("pairs + scaling: {:.2} ns/block", pairs(true, &a, &b, k, nb, m/16, n/16));
        println!("2x2 + scaling: {:.2} ns/block", two_by_two(&a, &b, k, nb, m/16, n/16));
    }}
}
