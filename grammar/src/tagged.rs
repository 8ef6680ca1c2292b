//! Tagged JSON: output that frames JSON values, each following its own schema, in literal
//! text — a model's tool-call syntax. With [`TaggedSpec::text_until`] the calls may instead
//! follow free text (OpenAI's `tool_choice: "auto"`): the text may not contain the trigger,
//! and once the trigger appears the rest is enforced.
//!
//! Shape of the language (`tag_i` = `begin_i JSON(schema_i) end_i`):
//!
//! ```text
//! calls := open tag (separator tag){min_calls-1 ..= max_calls-1} close
//! root  := calls                       (text_until = None)
//! root  := TEXT | TEXT calls           (text_until = Some(trigger); TEXT never holds trigger)
//! ```

use serde_json::Value;

use crate::nfa::{Builder, RuleId, StateId};
use crate::{CompileError, CompileOptions};

/// Most tags (functions) one tagged grammar may hold.
pub const MAX_TAGS: usize = 256;

/// Longest literal (begin, end, open, separator, close, trigger) in bytes.
pub const MAX_TAG_LITERAL: usize = 1024;

/// One alternative of a call: a literal `begin`, a JSON value of `schema`, a literal `end`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// Text before the value (e.g. `{"name": "get_weather", "arguments": `).
    pub begin: String,
    /// The value's JSON Schema (JSON text).
    pub schema: String,
    /// Text after the value (e.g. `}`).
    pub end: String,
}

/// A sequence of tagged JSON values framed by literal text: tool calls.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TaggedSpec {
    /// The alternatives each call chooses from (at least one).
    pub tags: Vec<Tag>,
    /// Text before the first call.
    pub open: String,
    /// Text between two calls.
    pub separator: String,
    /// Text after the last call.
    pub close: String,
    /// Fewest calls in the block (at least 1).
    pub min_calls: usize,
    /// Most calls in the block (`None`: no limit).
    pub max_calls: Option<usize>,
    /// `Some(trigger)`: free text may come first, and the block is optional. The text may
    /// not contain `trigger`; `open` + every tag's `begin` must start with it, so the first
    /// appearance of the trigger is where the calls start. The trigger is ASCII and its
    /// first character appears in it once (so a text ending in part of it cannot overlap
    /// the block's own trigger).
    pub text_until: Option<String>,
}

fn invalid(reason: impl Into<String>) -> CompileError {
    CompileError::InvalidSchema {
        pointer: "tagged".into(),
        reason: reason.into(),
    }
}

fn check(spec: &TaggedSpec) -> Result<(), CompileError> {
    if spec.tags.is_empty() {
        return Err(invalid("no tags"));
    }
    if spec.tags.len() > MAX_TAGS {
        return Err(CompileError::LimitExceeded {
            limit: "tagged grammar tags",
            max: MAX_TAGS,
        });
    }
    if spec.min_calls == 0 {
        return Err(invalid("min_calls must be at least 1"));
    }
    if spec.max_calls.is_some_and(|m| m < spec.min_calls) {
        return Err(invalid("max_calls is below min_calls"));
    }
    let literals = spec
        .tags
        .iter()
        .flat_map(|t| [&t.begin, &t.end])
        .chain([&spec.open, &spec.separator, &spec.close])
        .chain(spec.text_until.iter());
    for l in literals {
        if l.len() > MAX_TAG_LITERAL {
            return Err(CompileError::LimitExceeded {
                limit: "tagged grammar literal bytes",
                max: MAX_TAG_LITERAL,
            });
        }
    }
    if let Some(t) = &spec.text_until {
        let first = t.chars().next().ok_or_else(|| invalid("empty trigger"))?;
        if !t.is_ascii() || t.chars().filter(|&c| c == first).count() != 1 {
            return Err(invalid(
                "the trigger must be ASCII with its first character appearing once",
            ));
        }
        for tag in &spec.tags {
            if !format!("{}{}", spec.open, tag.begin).starts_with(t.as_str()) {
                return Err(invalid(format!(
                    "open + begin {:?} does not start with the trigger {t:?}",
                    crate::excerpt(&tag.begin)
                )));
            }
        }
    }
    Ok(())
}

/// Free text that does not contain `trigger`, from `from`; returns the state every such
/// text ends in. A matcher of the trigger's prefixes (no character repeats the first one, so
/// a mismatch restarts at 0, or at 1 on the first character).
fn text_without(b: &mut Builder, from: StateId, trigger: &[u8]) -> Result<StateId, CompileError> {
    let k = trigger.len();
    let exit = b.state()?;
    let mut states = vec![from];
    for _ in 1..k {
        states.push(b.state()?);
    }
    for (j, &s) in states.iter().enumerate() {
        b.eps(s, exit);
        // The trigger's next byte advances (the last one would complete it: not allowed).
        if j + 1 < k {
            b.range(s, trigger[j], trigger[j], states[j + 1]);
        }
        // The first byte restarts a match.
        if trigger[0] != trigger[j] {
            b.range(s, trigger[0], trigger[0], states[1.min(k - 1)]);
        }
        // Any other character returns to no match.
        let mut class = String::from("[^");
        for c in [trigger[j], trigger[0]] {
            class.push_str(&format!("\\x{c:02x}"));
        }
        class.push(']');
        let e = crate::regex::emit_pattern(
            b,
            s,
            &class,
            crate::regex::Flavor::FullMatch,
            crate::regex::Escape::Raw,
        )?;
        b.eps(e, states[0]);
    }
    Ok(exit)
}

/// One call from `from` to `to`: any tag's `begin` (less its first `skip` bytes, already
/// matched), its schema's rule, its `end`.
fn tag_choice(
    b: &mut Builder,
    from: StateId,
    to: StateId,
    spec: &TaggedSpec,
    schema_rules: &[RuleId],
    skip: usize,
) -> Result<(), CompileError> {
    for (tag, &r) in spec.tags.iter().zip(schema_rules) {
        let s = b.lit(from, &tag.begin.as_bytes()[skip..])?;
        let s = b.call(s, r)?;
        let s = b.lit(s, tag.end.as_bytes())?;
        b.eps(s, to);
    }
    Ok(())
}

/// Compiles `spec` into `b`; rule 0 is the root.
pub(crate) fn compile(
    b: &mut Builder,
    spec: &TaggedSpec,
    opts: &CompileOptions,
) -> Result<(), CompileError> {
    check(spec)?;
    let root = b.new_rule()?;
    let mut schema_rules: Vec<RuleId> = Vec::with_capacity(spec.tags.len());
    for tag in &spec.tags {
        let v: Value =
            serde_json::from_str(&tag.schema).map_err(|e| CompileError::Json(e.to_string()))?;
        schema_rules.push(crate::json::compile_rule(b, &v, opts)?);
    }
    // One call, any of the tags.
    let call_rule = b.new_rule()?;
    let cr = b.rules[call_rule as usize];
    tag_choice(b, cr.start, cr.end, spec, &schema_rules, 0)?;
    let r = b.rules[root as usize];
    let block = b.state()?;
    let first = match &spec.text_until {
        None => {
            b.eps(r.start, block);
            b.lit(block, spec.open.as_bytes())?
        }
        Some(trigger) => {
            // TEXT, then either the end or the block, whose first `open + begin` has the
            // trigger's bytes consumed by the text automaton's last step.
            let lo = b.states.len() as StateId;
            let text_end = text_without(b, r.start, trigger.as_bytes())?;
            // Free text is no JSON: `uniqueItems` tracking starts after it.
            b.text_ranges.push((r.start, r.start + 1));
            b.text_ranges.push((lo, b.states.len() as StateId));
            b.eps(text_end, r.end);
            let after_trigger = b.lit(text_end, trigger.as_bytes())?;
            b.eps(after_trigger, block);
            let rest_open = spec.open.get(trigger.len().min(spec.open.len())..);
            let rest_open = rest_open.unwrap_or("");
            b.lit(block, rest_open.as_bytes())?
        }
    };
    // The first call: when the trigger reaches into `begin`, each tag's begin is entered
    // past the trigger's remaining bytes.
    let after_first = match &spec.text_until {
        Some(trigger) if trigger.len() > spec.open.len() => {
            let exit = b.state()?;
            let skip = trigger.len() - spec.open.len();
            tag_choice(b, first, exit, spec, &schema_rules, skip)?;
            exit
        }
        _ => b.call(first, call_rule)?,
    };
    let min = spec.min_calls as u64 - 1;
    let max = spec.max_calls.map(|m| m as u64 - 1);
    let sep = spec.separator.as_bytes().to_vec();
    let last = b.repeat(after_first, min, max, &mut |b, s| {
        let s = b.lit(s, &sep)?;
        b.call(s, call_rule)
    })?;
    let done = b.lit(last, spec.close.as_bytes())?;
    b.eps(done, r.end);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CompiledGrammar, Matcher, TokenVocab};
    use std::sync::Arc;

    fn vocab() -> Arc<TokenVocab> {
        let mut tokens: Vec<Vec<u8>> = vec![Vec::new()];
        tokens.extend((0x20u8..0x7f).map(|b| vec![b]));
        tokens.push(b"\n".to_vec());
        tokens.push("é".as_bytes().to_vec());
        Arc::new(TokenVocab::new(tokens, &[], &[0]).unwrap())
    }

    fn id(b: u8) -> u32 {
        match b {
            b'\n' => 0x7f - 0x20 + 1,
            _ => (b - 0x20 + 1) as u32,
        }
    }

    /// Whether `text` (then EOS) is accepted, feeding one byte token at a time.
    fn accepts(g: &Arc<CompiledGrammar>, text: &str) -> bool {
        let mut m = Matcher::new(g.clone());
        for &b in text.as_bytes() {
            if m.accept_token(id(b)).is_err() {
                return false;
            }
        }
        m.is_accepting()
    }

    fn spec(text: bool, max: Option<usize>) -> TaggedSpec {
        let tag = |name: &str, schema: &str| Tag {
            begin: format!("{{\"name\": \"{name}\", \"arguments\": "),
            schema: schema.into(),
            end: "}".into(),
        };
        TaggedSpec {
            tags: vec![
                tag(
                    "weather",
                    r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"],"additionalProperties":false}"#,
                ),
                tag("time", r#"{"type":"object","additionalProperties":false}"#),
            ],
            open: "<tool_call>[".into(),
            separator: ", ".into(),
            close: "]</tool_call>".into(),
            min_calls: 1,
            max_calls: max,
            text_until: text.then(|| "<tool_call>".into()),
        }
    }

    fn compile(s: &TaggedSpec) -> Arc<CompiledGrammar> {
        CompiledGrammar::tagged(s, vocab(), &CompileOptions::default()).unwrap()
    }

    #[test]
    fn calls_only() {
        let g = compile(&spec(false, None));
        let one = r#"<tool_call>[{"name": "weather", "arguments": {"city":"Paris"}}]</tool_call>"#;
        assert!(accepts(&g, one));
        let two = r#"<tool_call>[{"name": "weather", "arguments": {"city":"Paris"}}, {"name": "time", "arguments": {}}]</tool_call>"#;
        assert!(accepts(&g, two));
        assert!(!accepts(&g, "Hello"));
        assert!(!accepts(
            &g,
            r#"<tool_call>[{"name": "other", "arguments": {}}]</tool_call>"#
        ));
        assert!(!accepts(
            &g,
            r#"<tool_call>[{"name": "weather", "arguments": {}}]</tool_call>"#
        ));
        // One call at most.
        let g1 = compile(&spec(false, Some(1)));
        assert!(accepts(&g1, one));
        assert!(!accepts(&g1, two));
        // Everything up to the first argument is forced when only one tag fits.
        let mut only = spec(false, Some(1));
        only.tags.truncate(1);
        let m = Matcher::new(compile(&only));
        assert_eq!(
            m.forced_bytes(),
            br#"<tool_call>[{"name": "weather", "arguments": {"city":""#
        );
    }

    #[test]
    fn text_or_calls() {
        let g = compile(&spec(true, None));
        assert!(accepts(&g, ""));
        assert!(accepts(&g, "It is sunny in Paris."));
        assert!(accepts(&g, "a <tool b <tool_cal"));
        let call = r#"<tool_call>[{"name": "time", "arguments": {}}]</tool_call>"#;
        assert!(accepts(&g, call));
        assert!(accepts(&g, &format!("Let me check. {call}")));
        assert!(accepts(&g, &format!("<tool_ca<{call}")));
        // Once the trigger appears, the call is enforced.
        assert!(!accepts(&g, "<tool_call>[{\"name\": \"nope\""));
        assert!(!accepts(&g, "see <tool_call> here"));
        // Nothing after the calls.
        assert!(!accepts(&g, &format!("{call} more")));
        // Non-ASCII text is fine.
        let mut m = Matcher::new(g.clone());
        m.accept_token(id(b'a')).unwrap();
        m.accept_token(0x7f - 0x20 + 2).unwrap();
        assert!(m.is_accepting());
    }

    #[test]
    fn trigger_inside_begin() {
        // Hermes-style: no `open`; each call opens with the trigger.
        let mut s = spec(true, None);
        s.open = String::new();
        s.close = String::new();
        s.separator = "\n".into();
        for t in &mut s.tags {
            t.begin = format!("<tool_call>\n{}", t.begin);
            t.end = "}\n</tool_call>".into();
        }
        let g = compile(&s);
        let call = "<tool_call>\n{\"name\": \"time\", \"arguments\": {}}\n</tool_call>";
        assert!(accepts(&g, call));
        assert!(accepts(&g, &format!("ok {call}\n{call}")));
        assert!(!accepts(&g, &format!("ok {call} {call}")));
        assert!(accepts(&g, "plain"));
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = spec(true, None);
        s.text_until = Some("<<a".into());
        assert!(CompiledGrammar::tagged(&s, vocab(), &CompileOptions::default()).is_err());
        let mut s = spec(true, None);
        s.text_until = Some("[x".into());
        assert!(CompiledGrammar::tagged(&s, vocab(), &CompileOptions::default()).is_err());
        let mut s = spec(false, None);
        s.tags.clear();
        assert!(CompiledGrammar::tagged(&s, vocab(), &CompileOptions::default()).is_err());
        let mut s = spec(false, None);
        s.tags[0].schema = "{".into();
        assert!(CompiledGrammar::tagged(&s, vocab(), &CompileOptions::default()).is_err());
    }
}
