#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sglrs_fuzz_targets::chat::chat_template(data));
