//! The GGUF model loader (`sglrs_model::gguf`, [`sglrs_model::load`]).

use std::io::Write;

use sglrs_model::chat::{Message, RenderOptions};
use sglrs_model::gguf::GgufFile;
use sglrs_model::{load, LoadOptions};

/// Largest file tried.
const MAX_FILE: usize = 256 << 10;
/// Largest tensor dequantized.
const MAX_ELEMENTS: usize = 1 << 16;

/// Writes the input as a `.gguf` file and loads it as `sglrs serve` does ([`load`]:
/// header, configuration, tokenizer, chat template, weights), then opens it again with
/// [`GgufFile`] and reads every tensor (dequantizing the small ones) and every metadata
/// accessor. Asserts that no input panics: offsets, counts and shapes in the file are never
/// trusted; a loaded model's weights have the shapes its configuration names.
pub fn gguf(data: &[u8]) {
    if data.len() > MAX_FILE {
        return;
    }
    let mut f = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::Builder::new()
            .suffix(".gguf")
            .tempfile_in("/dev/shm"),
        false => tempfile::Builder::new().suffix(".gguf").tempfile(),
    }
    .expect("a temporary file");
    f.write_all(data).expect("write the file");
    f.flush().expect("flush the file");
    if let Ok(m) = load(f.path(), &LoadOptions::default()) {
        let c = &m.config;
        assert_eq!(
            (m.weights.embed.rows, m.weights.embed.cols),
            (c.vocab_size, c.hidden_size)
        );
        assert_eq!(m.weights.layers.len(), c.num_layers);
        assert_eq!(m.weights.final_norm.len(), c.hidden_size);
        let _ = m.tokenizer.encode("ab <s>", true);
        if let Some(t) = &m.chat_template {
            let _ = t.render(&[Message::new("user", "hi")][..], &RenderOptions::default());
        }
    }
    let Ok(g) = GgufFile::open(f.path()) else {
        return;
    };
    let _ = g.config();
    let _ = g.architecture();
    for key in g.metadata().keys() {
        let _ = (
            g.get_str(key),
            g.get_uint(key),
            g.get_float(key),
            g.get_bool(key),
        );
        let _ = g.get_array(key);
    }
    let mut names: Vec<&String> = g.tensor_infos().keys().collect();
    names.sort();
    for name in names {
        let Ok(w) = g.weight(name) else { continue };
        if w.rows.saturating_mul(w.cols) <= MAX_ELEMENTS {
            let v = g.f32_vec(name).expect("a weight that opens dequantizes");
            assert_eq!(v.len(), w.rows * w.cols);
        }
    }
}

/// A tiny valid GGUF (v3) model: Llama, one layer, hidden size 8, two query heads and one
/// KV head, a five-token byte-level BPE vocabulary, a ChatML template; F32 and F16 tensors.
/// The seed of the `gguf` corpus.
pub fn tiny_model() -> Vec<u8> {
    enum V {
        U32(u32),
        Str(&'static str),
        Strs(&'static [&'static str]),
        I32s(&'static [i32]),
    }
    let kvs: &[(&str, V)] = &[
        ("general.architecture", V::Str("llama")),
        ("llama.block_count", V::U32(1)),
        ("llama.embedding_length", V::U32(8)),
        ("llama.attention.head_count", V::U32(2)),
        ("llama.attention.head_count_kv", V::U32(1)),
        ("llama.feed_forward_length", V::U32(16)),
        ("llama.context_length", V::U32(64)),
        ("tokenizer.ggml.model", V::Str("gpt2")),
        (
            "tokenizer.ggml.tokens",
            V::Strs(&["a", "b", "ab", "<s>", "</s>"]),
        ),
        ("tokenizer.ggml.merges", V::Strs(&["a b"])),
        ("tokenizer.ggml.token_type", V::I32s(&[1, 1, 1, 3, 3])),
        ("tokenizer.ggml.bos_token_id", V::U32(3)),
        ("tokenizer.ggml.eos_token_id", V::U32(4)),
        (
            "tokenizer.chat_template",
            V::Str(
                "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}\
                 {% if add_generation_prompt %}<s>assistant\n{% endif %}",
            ),
        ),
    ];
    // (name, rows, cols, ggml type: 0 = F32, 1 = F16)
    let tensors: &[(&str, u64, u64, u32)] = &[
        ("token_embd.weight", 5, 8, 0),
        ("blk.0.attn_norm.weight", 1, 8, 0),
        ("blk.0.attn_q.weight", 8, 8, 0),
        ("blk.0.attn_k.weight", 4, 8, 0),
        ("blk.0.attn_v.weight", 4, 8, 0),
        ("blk.0.attn_output.weight", 8, 8, 0),
        ("blk.0.ffn_norm.weight", 1, 8, 0),
        ("blk.0.ffn_gate.weight", 16, 8, 1),
        ("blk.0.ffn_up.weight", 16, 8, 1),
        ("blk.0.ffn_down.weight", 8, 16, 1),
        ("output_norm.weight", 1, 8, 0),
    ];
    fn s(out: &mut Vec<u8>, v: &str) {
        out.extend((v.len() as u64).to_le_bytes());
        out.extend(v.as_bytes());
    }
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for (k, v) in kvs {
        s(&mut out, k);
        match v {
            V::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            V::Str(x) => {
                out.extend(8u32.to_le_bytes());
                s(&mut out, x);
            }
            V::Strs(xs) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| s(&mut out, x));
            }
            V::I32s(xs) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
        }
    }
    let mut offset = 0u64;
    let mut blobs = Vec::new();
    for (i, &(name, rows, cols, ty)) in tensors.iter().enumerate() {
        s(&mut out, name);
        if rows == 1 {
            out.extend(1u32.to_le_bytes());
            out.extend(cols.to_le_bytes());
        } else {
            out.extend(2u32.to_le_bytes());
            out.extend(cols.to_le_bytes()); // innermost first
            out.extend(rows.to_le_bytes());
        }
        out.extend(ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        let mut blob = Vec::new();
        for j in 0..rows * cols {
            let x = ((i as f32) + j as f32 * 0.01).sin();
            match ty {
                0 => blob.extend(x.to_le_bytes()),
                _ => blob.extend(half::f16::from_f32(x).to_le_bytes()),
            }
        }
        while !blob.len().is_multiple_of(32) {
            blob.push(0);
        }
        offset += blob.len() as u64;
        blobs.push(blob);
    }
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    blobs.iter().for_each(|b| out.extend(b));
    out
}
