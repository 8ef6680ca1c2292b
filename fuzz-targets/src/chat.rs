//! Chat-template rendering (`sglrs_model::chat`).

use sglrs_model::chat::{ChatError, ChatTemplate, RenderOptions};

use crate::input::Input;

/// Longest template tried.
const MAX_TEMPLATE: usize = 4096;
/// Longest message list tried (JSON).
const MAX_MESSAGES: usize = 4096;

/// A length-prefixed template source, then the messages: the rest of the input as a JSON
/// list when it parses as one, else one user message holding it. Compiles and renders under
/// the template fuel ([`sglrs_model::chat::TEMPLATE_FUEL`]). Asserts that nothing panics, that
/// a compiled template renders or fails as a render (never as a compile error), and that its
/// clone renders what it does (for templates that do not read the clock).
pub fn chat_template(data: &[u8]) {
    let mut inp = Input::new(data);
    let flags = inp.u8();
    let len = usize::from(inp.u16()).min(MAX_TEMPLATE);
    let source = String::from_utf8_lossy(inp.bytes(len)).into_owned();
    let rest = inp.bytes(MAX_MESSAGES);
    let messages = match serde_json::from_slice::<serde_json::Value>(rest) {
        Ok(v @ serde_json::Value::Array(_)) => v,
        _ => serde_json::json!([
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": String::from_utf8_lossy(rest)},
        ]),
    };
    let bos = (flags & 1 != 0).then(|| "<s>".to_string());
    let eos = (flags & 2 != 0).then(|| "</s>".to_string());
    let Ok(t) = ChatTemplate::new(&source, bos, eos) else {
        return;
    };
    let mut opts = RenderOptions {
        add_generation_prompt: flags & 4 != 0,
        ..RenderOptions::default()
    };
    if flags & 8 != 0 {
        opts.tools = Some(serde_json::json!([
            {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}
        ]));
    }
    if flags & 16 != 0 {
        opts.extra
            .insert("enable_thinking".into(), serde_json::Value::Bool(false));
    }
    match t.render(&messages, &opts) {
        Ok(first) if !source.contains("strftime") => {
            let again = t.clone().render(&messages, &opts);
            assert_eq!(
                Some(&first),
                again.as_ref().ok(),
                "a clone renders differently"
            );
        }
        Err(ChatError::Compile(e)) => panic!("a compiled template fails to compile: {e}"),
        _ => {}
    }
}
