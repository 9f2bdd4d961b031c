#![no_main]
//! See `augur::fuzzing::safetensors`: any bytes must give Ok or an error, never a panic, a hang or an abort.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = augur::fuzzing::safetensors(data);
});
