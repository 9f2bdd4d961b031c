#![no_main]
//! See `augur::fuzzing::chat_template`: any bytes must give Ok or an error, never a panic, a hang or an abort.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = augur::fuzzing::chat_template(data);
});
