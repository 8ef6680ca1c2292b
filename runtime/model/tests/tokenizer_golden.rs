//! The GGUF tokenizer and chat template against llama.cpp's golden output
//! (`shared/golden/smollm2-q4_1-greedy.json`): ids plain and with special tokens parsed,
//! every case's prompt ids, and the chat prompts rendered from their messages.

use std::path::PathBuf;

use serde_json::Value;
use sglrs_model::chat::{Message, RenderOptions};
use sglrs_model::{LoadOptions, LoadedModel};

fn golden_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SGLRS_GOLDEN") {
        return PathBuf::from(p);
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for base in [
        here.join("../../../shared"),
        here.join("../shared"),
        PathBuf::from("/work/shared"),
    ] {
        let p = base.join("golden/smollm2-q4_1-greedy.json");
        if p.exists() {
            return p;
        }
    }
    panic!("golden file not found; set SGLRS_GOLDEN");
}

fn golden() -> Value {
    serde_json::from_str(&std::fs::read_to_string(golden_path()).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn load() -> LoadedModel {
    sglrs_model::load(&sglrs_model::default_model_path(), &LoadOptions::default())
        .expect("load model")
}

#[test]
fn tokenization_matches_llama_cpp() {
    let g = golden();
    let m = load();
    let tk = &m.tokenizer;
    assert_eq!(tk.bos_id(), Some(g["bos_id"].as_u64().unwrap() as u32));
    assert_eq!(tk.eos_id(), Some(g["eos_id"].as_u64().unwrap() as u32));
    assert!(!tk.add_bos());
    let cases = g["tokenization"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let plain = tk.encode(text, false).unwrap();
        let special = tk.encode(text, true).unwrap();
        if plain != ids(&c["ids_plain"]) {
            failures.push(format!(
                "plain {text:?}: {plain:?} != {:?}",
                ids(&c["ids_plain"])
            ));
        }
        if special != ids(&c["ids_special"]) {
            failures.push(format!(
                "special {text:?}: {special:?} != {:?}",
                ids(&c["ids_special"])
            ));
        }
        // Decoding gives the text back, both ways.
        assert_eq!(tk.decode(&plain, false).unwrap(), text);
        assert_eq!(tk.decode(&special, false).unwrap(), text);
        // token_bytes concatenate to the text's bytes.
        let bytes: Vec<u8> = plain
            .iter()
            .flat_map(|&i| tk.token_bytes(i).unwrap().to_vec())
            .collect();
        assert_eq!(bytes, text.as_bytes());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn case_prompt_ids_match_llama_cpp() {
    let g = golden();
    let m = load();
    for c in g["cases"].as_array().unwrap() {
        let prompt = c["prompt"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode(prompt, true).unwrap(),
            ids(&c["prompt_ids"]),
            "prompt {prompt:?}"
        );
    }
}

/// The user message of a rendered chat prompt (between `<|im_start|>user\n` and `<|im_end|>`).
fn user_message(prompt: &str) -> &str {
    let start = prompt.find("<|im_start|>user\n").unwrap() + "<|im_start|>user\n".len();
    let end = start + prompt[start..].find("<|im_end|>").unwrap();
    &prompt[start..end]
}

#[test]
fn chat_template_renders_golden_prompts() {
    let g = golden();
    let m = load();
    let t = m.chat_template.as_ref().expect("GGUF has a chat template");
    assert_eq!(t.source(), g["chat_template"].as_str().unwrap());
    let opts = RenderOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    let mut n = 0;
    for c in g["cases"].as_array().unwrap() {
        if c["kind"] != "chat" {
            continue;
        }
        let prompt = c["prompt"].as_str().unwrap();
        let msgs = [Message::new("user", user_message(prompt))];
        assert_eq!(t.render(&msgs, &opts).unwrap(), prompt);
        n += 1;
    }
    assert!(n >= 10);
    // An explicit system message replaces the default one; no generation prompt, no tail.
    let msgs = [
        Message::new("system", "Be brief."),
        Message::new("user", "hi"),
    ];
    assert_eq!(
        t.render(&msgs, &RenderOptions::default()).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    );
}

#[test]
fn special_token_queries() {
    let m = load();
    let tk = &m.tokenizer;
    assert_eq!(tk.vocab_size(), 49152);
    assert_eq!(tk.token_to_id("<|im_end|>"), Some(2));
    assert!(tk.is_special(1) && tk.is_special(2));
    assert!(!tk.is_special(19556));
    assert_eq!(tk.token_bytes(216), Some(&b" "[..]));
    assert_eq!(tk.id_to_token(260).as_deref(), Some("\u{120}the"));
    assert_eq!(tk.token_bytes(260), Some(&b" the"[..]));
    assert!(tk.eog_ids().contains(&2) && tk.eog_ids().contains(&0));
    assert_eq!(tk.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(
        tk.decode(&[1, 4093, 198, 6004, 2], true).unwrap(),
        "user\nhi"
    );
    assert_eq!(tk.token_bytes(1_000_000), None);
    // The grammar crate builds its vocabulary from the inner tokenizer.
    assert_eq!(tk.inner().get_vocab_size(true), 49152);
}
