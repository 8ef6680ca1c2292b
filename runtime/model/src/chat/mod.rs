//! Chat templates: the model's Jinja template rendered with minijinja the way HF
//! `transformers` renders it (`trim_blocks`, `lstrip_blocks`, loop controls, Python string
//! methods, `raise_exception`, `strftime_now`, a Python-compatible `tojson`).
//!
//! ```
//! use sglrs_model::chat::{ChatTemplate, RenderOptions};
//! let t = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}\n{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//!     None,
//!     None,
//! )?;
//! let msgs = serde_json::json!([{"role": "user", "content": " hi "}]);
//! let text = t.render(&msgs, &RenderOptions { add_generation_prompt: true, ..Default::default() })?;
//! assert_eq!(text, "<|user|>hi\n<|assistant|>");
//! # Ok::<(), sglrs_model::chat::ChatError>(())
//! ```

mod pyjson;

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

/// Why a chat template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    /// The template does not parse.
    #[error("template does not compile: {0}")]
    Compile(String),
    /// Rendering failed (including the template's own `raise_exception`).
    #[error("rendering failed: {0}")]
    Render(String),
    /// Rendering ran past its instruction budget ([`TEMPLATE_FUEL`]).
    #[error("the chat template ran past its limit of {0} instructions")]
    OutOfFuel(u64),
}

/// Instructions one render of a chat template may run. A real conversation's render takes a
/// few hundred per message; the bound stops a template loop (or a request with an absurd
/// number of messages) long before it holds a worker for more than a fraction of a second.
pub const TEMPLATE_FUEL: u64 = 5_000_000;

/// One chat message (the usual shape; any serializable value works with
/// [`ChatTemplate::render`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Options of one rendering.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// Append the assistant turn's opening (`add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// Tool definitions (`tools`), if the request has any.
    pub tools: Option<serde_json::Value>,
    /// Further template variables (e.g. `enable_thinking`).
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// A compiled chat template with the model's BOS/EOS texts.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl Clone for ChatTemplate {
    fn clone(&self) -> Self {
        // The source compiled once already; compiling it again cannot fail.
        match ChatTemplate::new(
            &self.source,
            Some(self.bos_token.clone()),
            Some(self.eos_token.clone()),
        ) {
            Ok(t) => t,
            Err(_) => ChatTemplate {
                env: Environment::new(),
                source: self.source.clone(),
                bos_token: self.bos_token.clone(),
                eos_token: self.eos_token.clone(),
            },
        }
    }
}

const NAME: &str = "chat";

fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    // HF passes these through to json.dumps; accept and ignore the ones that do not change
    // the output of a JSON-compatible value.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(Value::from_safe_string(pyjson::dumps(&json, indent)))
}

impl ChatTemplate {
    /// Compiles `source`. `bos_token` / `eos_token` are the texts the template sees (empty if
    /// the model has none).
    pub fn new(
        source: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token: bos_token.unwrap_or_default(),
            eos_token: eos_token.unwrap_or_default(),
        })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (a list of message objects) into the prompt text.
    pub fn render<M: Serialize + ?Sized>(
        &self,
        messages: &M,
        opts: &RenderOptions,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Compile(e.to_string()))?;
        let mut ctx = serde_json::Map::new();
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let messages =
            serde_json::to_value(messages).map_err(|e| ChatError::Render(e.to_string()))?;
        ctx.insert("messages".into(), messages);
        ctx.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        if let Some(tools) = &opts.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        tmpl.render(Value::from(minijinja::value::Serde(&ctx)))
            .map_err(|e| match e.kind() {
                ErrorKind::OutOfFuel => ChatError::OutOfFuel(TEMPLATE_FUEL),
                _ => ChatError::Render(render_error_text(&e)),
            })
    }
}

/// The error message with its cause chain (minijinja nests the template's own message).
fn render_error_text(e: &minijinja::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// `strftime_now(format)`: the current UTC time, for templates that print today's date.
/// Supports `%Y %m %d %H %M %S %B %b %y %j %%` and `%-d`-style unpadded fields.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime(&format, secs)
}

fn strftime(format: &str, unix: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = (unix / 86_400) as i64;
    let rem = unix % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let num = |v: i64, w: usize| {
            if unpadded {
                v.to_string()
            } else {
                format!("{v:0w$}")
            }
        };
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&num(year % 100, 2)),
            Some('m') => out.push_str(&num(month, 2)),
            Some('d') => out.push_str(&num(day, 2)),
            Some('j') => out.push_str(&num(yday, 3)),
            Some('H') => out.push_str(&num(h as i64, 2)),
            Some('M') => out.push_str(&num(m as i64, 2)),
            Some('S') => out.push_str(&num(s as i64, 2)),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runaway_template_stops_at_its_fuel_and_real_ones_do_not() {
        let looping = "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(looping, None, None).unwrap();
        let start = std::time::Instant::now();
        let err = t.render(&[Message::new("user", "hi")][..], &RenderOptions::default());
        assert!(
            matches!(err, Err(ChatError::OutOfFuel(TEMPLATE_FUEL))),
            "{err:?}"
        );
        assert!(start.elapsed() < std::time::Duration::from_secs(5));

        // A ChatML template over 5,000 messages renders well inside the budget.
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(chatml, None, None).unwrap();
        let msgs: Vec<Message> = (0..5_000)
            .map(|i| {
                Message::new(
                    if i % 2 == 0 { "user" } else { "assistant" },
                    format!("turn {i}"),
                )
            })
            .collect();
        let out = t
            .render(
                &msgs[..],
                &RenderOptions {
                    add_generation_prompt: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(out.contains("turn 4999") && out.ends_with("<|im_start|>assistant\n"));
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S", 1_709_211_909),
            "2024-02-29 13:05:09"
        );
        assert_eq!(strftime("%d %b %Y", 1_709_211_909), "29 Feb 2024");
        assert_eq!(strftime("%-d %B, day %j", 0), "1 January, day 001");
    }

    #[test]
    fn hf_whitespace_and_python_methods() {
        let src = "{% for m in messages %}\n  {{- m['content'].upper() }}|\n{% endfor %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let out = t
            .render(
                &[Message::new("user", "a"), Message::new("user", "b")],
                &RenderOptions::default(),
            )
            .unwrap();
        assert_eq!(out, "A|\nB|\n");
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None).unwrap();
        let err = t
            .render(&serde_json::json!([]), &RenderOptions::default())
            .unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
        assert!(matches!(
            ChatTemplate::new("{% for %}", None, None),
            Err(ChatError::Compile(_))
        ));
    }

    #[test]
    fn tojson_matches_python() {
        let t = ChatTemplate::new("{{ tools | tojson }}", None, None).unwrap();
        let opts = RenderOptions {
            tools: Some(serde_json::json!([{"name": "f", "d": "<é>", "n": [1, 2.5]}])),
            ..Default::default()
        };
        let out = t.render(&serde_json::json!([]), &opts).unwrap();
        assert_eq!(out, r#"[{"name": "f", "d": "<é>", "n": [1, 2.5]}]"#);
    }
}
