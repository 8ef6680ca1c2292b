//! Tool calling: how a model writes calls ([`ToolSyntax`]), how tools, past calls and
//! their results reach its prompt, the grammar that enforces `tool_choice` and
//! `parallel_tool_calls`, and the parser that reads calls back — whole, or as OpenAI's
//! streamed `tool_calls` deltas.
//!
//! Every call is written as `{"name": NAME, "arguments": ARGS}` framed by the syntax's
//! literals; with enforcement the grammar fixes that layout byte for byte, so the parser
//! is exact: it reads the name once its closing quote arrives and streams `ARGS` as the
//! model writes it.

use serde_json::{json, Value};
use sglrs_grammar::{Tag, TaggedSpec};

use crate::error::ApiError;

/// The text that opens tool calls in the tagged syntaxes (and in free output).
const TRIGGER: &str = "<tool_call>";

/// Longest function name (OpenAI's limit).
const MAX_NAME: usize = 64;

/// `s` as an error message quotes it: its first 80 characters, then `…` when cut.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(80) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// How a model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// The chat template renders `tools` and writes one
    /// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` block per call (Hermes,
    /// Qwen2.5 and the templates derived from them).
    Hermes,
    /// sglrs's own form, for templates that know no tools (SmolLM2's among them): the tool
    /// list goes into the system message, and the calls are one JSON list,
    /// `<tool_call>[{"name": …, "arguments": …}, …]</tool_call>` — the form SmolLM2 was
    /// trained to call functions in.
    List,
    /// Llama 3.x (the template renders `tools` and has Llama 3's header tokens): each call
    /// is the JSON object `{"name": …, "parameters": …}` the template asks for, calls
    /// separated by `; `.
    Llama3,
}

impl ToolSyntax {
    /// The syntax a chat template implies (`None`: no template).
    pub fn of_template(source: Option<&str>) -> Self {
        match source {
            Some(s) if s.contains("tools") && s.contains(TRIGGER) => ToolSyntax::Hermes,
            Some(s) if s.contains("tools") && s.contains("<|start_header_id|>") => {
                ToolSyntax::Llama3
            }
            _ => ToolSyntax::List,
        }
    }

    /// The text every call block starts with: free text (`tool_choice: "auto"`) may not
    /// contain it, and the calls start where it first appears.
    fn trigger(self) -> &'static str {
        match self {
            ToolSyntax::Hermes | ToolSyntax::List => TRIGGER,
            ToolSyntax::Llama3 => "{\"name\": ",
        }
    }

    /// (`open`, `separator`, `close`, the text before a call's name, the text between the
    /// name and the arguments, the text after the arguments).
    fn literals(self) -> [&'static str; 6] {
        match self {
            ToolSyntax::Hermes => [
                "",
                "\n",
                "",
                "<tool_call>\n{\"name\": ",
                ", \"arguments\": ",
                "}\n</tool_call>",
            ],
            ToolSyntax::List => [
                "<tool_call>[",
                ", ",
                "]</tool_call>",
                "{\"name\": ",
                ", \"arguments\": ",
                "}",
            ],
            ToolSyntax::Llama3 => ["", "; ", "", "{\"name\": ", ", \"parameters\": ", "}"],
        }
    }

    /// Whether the chat template renders the tool list itself.
    pub fn template_renders_tools(self) -> bool {
        self != ToolSyntax::List
    }
}

/// A function tool, checked.
#[derive(Clone, Debug)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON Schema of its arguments (`{"type": "object"}` when not given).
    pub parameters: Value,
}

/// Checks a function's name: 1–64 of `[A-Za-z0-9_.-]` (OpenAI's set, plus the dots of
/// namespaced names).
pub fn check_name(name: &str, field: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            field,
            format!(
                "function names are 1-{MAX_NAME} characters of A-Z, a-z, 0-9, '_', '-' and '.'"
            ),
        ))
    }
}

/// What the calls must look like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRules {
    /// Text instead of calls is allowed (`tool_choice: "auto"`).
    pub text_allowed: bool,
    /// More than one call is allowed (`parallel_tool_calls`).
    pub parallel: bool,
}

/// The grammar that enforces `rules` over `functions` in `syntax`.
pub fn grammar(syntax: ToolSyntax, functions: &[&Function], rules: &CallRules) -> TaggedSpec {
    let [open, separator, close, before_name, after_name, end] = syntax.literals();
    TaggedSpec {
        tags: functions
            .iter()
            .map(|f| Tag {
                begin: format!("{before_name}{}{after_name}", json!(f.name)),
                schema: f.parameters.to_string(),
                end: end.to_string(),
            })
            .collect(),
        open: open.into(),
        separator: separator.into(),
        close: close.into(),
        min_calls: 1,
        max_calls: (!rules.parallel).then_some(1),
        text_until: rules.text_allowed.then(|| syntax.trigger().to_string()),
    }
}

/// One call as the model writes it (`arguments` as JSON text).
fn call_text(syntax: ToolSyntax, name: &str, arguments: &str) -> String {
    let [_, _, _, before_name, after_name, end] = syntax.literals();
    format!("{before_name}{}{after_name}{arguments}{end}", json!(name))
}

/// Calls as the model writes them.
fn calls_text(syntax: ToolSyntax, calls: &[(String, String)]) -> String {
    let [open, separator, close, ..] = syntax.literals();
    let parts: Vec<String> = calls.iter().map(|(n, a)| call_text(syntax, n, a)).collect();
    format!("{open}{}{close}", parts.join(separator))
}

/// The system-message text that describes `functions` for a template that knows no tools.
/// It depends on the functions alone, not on `tool_choice` or `parallel_tool_calls` (the
/// grammar enforces those): an agent loop that changes its choice from turn to turn keeps
/// its whole prefix in the radix cache.
fn tools_prompt(functions: &[&Function]) -> String {
    let mut s = String::from(
        "You can call functions. Each one is described below with a JSON Schema of its \
         arguments:\n<tools>\n",
    );
    for f in functions {
        let mut d = json!({"name": f.name, "parameters": f.parameters});
        if let Some(desc) = &f.description {
            d["description"] = json!(desc);
        }
        s.push_str(&d.to_string());
        s.push('\n');
    }
    s.push_str(
        "</tools>\nTo call functions, answer with only <tool_call>[{\"name\": \"function name\", \
         \"arguments\": {…}}, …]</tool_call>, one list item per call. If no function fits, \
         answer in plain text.",
    );
    s
}

/// The `(name, arguments)` of an assistant message's `tool_calls` (OpenAI's shape:
/// `[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]`), with the
/// arguments parsed as JSON.
fn past_calls(v: &Value, field: &str) -> Result<Vec<(String, Value)>, ApiError> {
    let bad = |why: &str| ApiError::bad(field, why.to_string());
    let list = v
        .as_array()
        .ok_or_else(|| bad("tool_calls is not a list"))?;
    list.iter()
        .map(|c| {
            let f = c
                .get("function")
                .ok_or_else(|| bad("a tool call has no function"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a tool call has no function.name"))?;
            let args = match f.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(s)) => serde_json::from_str(s)
                    .map_err(|_| bad("a tool call's function.arguments is not JSON"))?,
                Some(other) => other.clone(),
            };
            Ok((name.to_string(), args))
        })
        .collect()
}

/// The messages as the chat template gets them, and the `tools` variable it gets.
///
/// Assistant messages' `tool_calls` get their arguments as JSON values (templates write
/// them with `tojson`). For a template that knows no tools ([`ToolSyntax::List`]), the tool
/// list is appended to the system message (one is added when there is none), and past calls
/// become the assistant's text in the syntax the model answers in.
pub fn prompt_messages(
    syntax: ToolSyntax,
    mut messages: Vec<Value>,
    functions: &[&Function],
    rules: Option<&CallRules>,
) -> Result<(Vec<Value>, Option<Value>), ApiError> {
    for (i, m) in messages.iter_mut().enumerate() {
        let Some(tc) = m.get("tool_calls").cloned() else {
            continue;
        };
        let field = format!("messages[{i}].tool_calls");
        let calls = past_calls(&tc, &field)?;
        match syntax {
            ToolSyntax::Hermes | ToolSyntax::Llama3 => {
                let list: Vec<Value> = tc
                    .as_array()
                    .into_iter()
                    .flatten()
                    .zip(&calls)
                    .map(|(orig, (name, args))| {
                        let mut c = orig.clone();
                        c["function"] = json!({"name": name, "arguments": args});
                        c
                    })
                    .collect();
                m["tool_calls"] = Value::Array(list);
            }
            ToolSyntax::List => {
                let text: Vec<(String, String)> = calls
                    .iter()
                    .map(|(n, a)| (n.clone(), a.to_string()))
                    .collect();
                let before = m["content"].as_str().unwrap_or("").trim_end().to_string();
                let calls = calls_text(syntax, &text);
                let content = if before.is_empty() {
                    calls
                } else {
                    format!("{before}\n{calls}")
                };
                m["content"] = json!(content);
                if let Some(o) = m.as_object_mut() {
                    o.remove("tool_calls");
                }
            }
        }
    }
    if rules.is_none() {
        return Ok((messages, None));
    }
    let tools = json!(functions
        .iter()
        .map(|f| json!({"type": "function", "function": {
            "name": f.name, "description": f.description, "parameters": f.parameters}}))
        .collect::<Vec<_>>());
    if syntax.template_renders_tools() {
        return Ok((messages, Some(tools)));
    }
    let text = tools_prompt(functions);
    match messages.first_mut() {
        Some(m) if m["role"] == "system" => {
            let before = m["content"].as_str().unwrap_or("").to_string();
            m["content"] = json!(if before.is_empty() {
                text
            } else {
                format!("{before}\n\n{text}")
            });
        }
        _ => messages.insert(0, json!({"role": "system", "content": text})),
    }
    Ok((messages, None))
}

/// One call read from the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name (known once its closing quote arrived).
    pub name: String,
    /// The arguments' JSON text so far.
    pub arguments: String,
    /// Whether the arguments are complete.
    pub complete: bool,
}

/// What an output holds so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text before the calls that is sure to be text (a tail that could still open a call
    /// is held back until the output is final).
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
    /// Whether the output left the syntax (only possible without enforcement): what
    /// follows the calls read so far is not parsed.
    pub malformed: bool,
}

/// Reads the calls out of `text`, the output so far (`done`: the whole output).
///
/// `text_allowed`: the output may begin with text (`tool_choice: "auto"`). The parser
/// follows the syntax's literals and JSON's own grammar; it never panics, whatever `text`
/// holds.
pub fn parse(syntax: ToolSyntax, text: &str, text_allowed: bool, done: bool) -> Parsed {
    let mut out = Parsed::default();
    let rest = if text_allowed {
        let trigger = syntax.trigger();
        match text.find(trigger) {
            Some(p) => {
                out.content = text[..p].to_string();
                &text[p..]
            }
            None => {
                let hold = if done {
                    0
                } else {
                    partial_suffix(text, trigger)
                };
                out.content = text[..text.len() - hold].to_string();
                return out;
            }
        }
    } else {
        text
    };
    let [open, separator, close, before_name, after_name, end] = syntax.literals();
    let mut r = Reader { s: rest, pos: 0 };
    if !r.literal(open) {
        out.malformed = !r.at_end();
        return out;
    }
    loop {
        if !r.literal(before_name) {
            out.malformed = !r.at_end();
            return out;
        }
        let Some(name) = r.json_string() else {
            out.malformed = !r.at_end();
            return out;
        };
        if !r.literal(after_name) {
            out.malformed = !r.at_end();
            return out;
        }
        let (arguments, complete) = r.json_value();
        out.calls.push(ParsedCall {
            name,
            arguments: arguments.to_string(),
            complete,
        });
        if !complete || !r.literal(end) {
            out.malformed = !r.at_end();
            return out;
        }
        if r.at_end() {
            return out;
        }
        // A separator and another call, or the close.
        let save = r.pos;
        if !separator.is_empty() && r.literal(separator) {
            if r.at_end() {
                return out;
            }
            if r.peek_literal(before_name) {
                continue;
            }
            r.pos = save;
        }
        if !r.literal(close) || !r.at_end() {
            out.malformed = !r.at_end();
        }
        return out;
    }
}

/// Reads calls out of unconstrained output (`--disable-tool-grammar`): the JSON at each of
/// the syntax's triggers (after each `<tool_call>`; Llama 3's `{"name": …}` objects), a
/// list or one object, whose items name one of `names`. Whatever does not
/// parse stays text; nothing is repaired.
pub fn parse_free(syntax: ToolSyntax, text: &str, names: &[String]) -> Parsed {
    let mut out = Parsed::default();
    let trigger = syntax.trigger();
    // Llama 3's trigger is the start of the call's own JSON; the tags precede theirs.
    let skip = if syntax == ToolSyntax::Llama3 {
        0
    } else {
        trigger.len()
    };
    let Some(first) = text.find(trigger) else {
        out.content = text.to_string();
        return out;
    };
    out.content = text[..first].to_string();
    let mut rest = &text[first..];
    while let Some(p) = rest.find(trigger) {
        let after = rest[p + skip..].trim_start();
        let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
        let Some(Ok(v)) = values.next() else {
            out.malformed = true;
            break;
        };
        let items = match v {
            Value::Array(a) => a,
            other => vec![other],
        };
        for item in items {
            let name = item.get("name").and_then(Value::as_str);
            let args = item.get("arguments").or_else(|| item.get("parameters"));
            match (name, args) {
                (Some(n), Some(a)) if names.iter().any(|x| x == n) => out.calls.push(ParsedCall {
                    name: n.to_string(),
                    arguments: a.to_string(),
                    complete: true,
                }),
                _ => out.malformed = true,
            }
        }
        rest = &after[values.byte_offset()..];
    }
    if out.calls.is_empty() {
        out.content = text.to_string();
    }
    out
}

/// Length of the longest suffix of `text` that is a proper prefix of `pat`.
fn partial_suffix(text: &str, pat: &str) -> usize {
    (1..pat.len())
        .rev()
        .find(|&n| text.ends_with(&pat[..n]))
        .unwrap_or(0)
}

/// A cursor over the calls' text. Methods that cannot finish because the text ends return
/// `false`/`None` with [`Reader::at_end`] true.
struct Reader<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn at_end(&self) -> bool {
        self.pos >= self.s.len()
    }

    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    /// Consumes `lit`. When the text ends inside it, consumes the rest and returns false.
    fn literal(&mut self, lit: &str) -> bool {
        let rest = self.rest();
        if rest.starts_with(lit) {
            self.pos += lit.len();
            true
        } else {
            if lit.starts_with(rest) {
                self.pos = self.s.len();
            }
            false
        }
    }

    fn peek_literal(&self, lit: &str) -> bool {
        let rest = self.rest();
        rest.starts_with(lit) || lit.starts_with(rest)
    }

    /// A JSON string, decoded; `None` when it is incomplete or malformed.
    fn json_string(&mut self) -> Option<String> {
        let rest = self.rest();
        if !rest.starts_with('"') {
            return None;
        }
        let mut escaped = false;
        for (i, c) in rest.char_indices().skip(1) {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    let s: String = serde_json::from_str(&rest[..=i]).ok()?;
                    self.pos += i + 1;
                    return Some(s);
                }
                _ => {}
            }
        }
        self.pos = self.s.len();
        None
    }

    /// A JSON value's text (an object or array by bracket depth, a scalar up to the next
    /// delimiter) and whether it is complete.
    fn json_value(&mut self) -> (&'a str, bool) {
        let rest = self.rest();
        let mut depth = 0usize;
        let mut in_str = false;
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            if in_str {
                match c {
                    _ if escaped => escaped = false,
                    '\\' => escaped = true,
                    '"' => {
                        in_str = false;
                        if depth == 0 {
                            self.pos += i + 1;
                            return (&rest[..=i], true);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_str = true,
                '{' | '[' => depth += 1,
                '}' | ']' if depth > 0 => {
                    depth -= 1;
                    if depth == 0 {
                        self.pos += i + 1;
                        return (&rest[..=i], true);
                    }
                }
                '}' | ']' | ',' if depth == 0 => {
                    self.pos += i;
                    return (&rest[..i], i > 0);
                }
                _ => {}
            }
        }
        self.pos = self.s.len();
        (rest, false)
    }
}

/// The streamed form of one sample's output: what has been sent, so each new piece of text
/// becomes OpenAI's deltas (`content`, a call's opening with its id and name, arguments).
#[derive(Debug)]
pub struct StreamState {
    syntax: ToolSyntax,
    text_allowed: bool,
    text: String,
    sent_content: usize,
    /// Arguments bytes sent per call announced.
    sent_args: Vec<usize>,
    /// Unconstrained output (`--disable-tool-grammar`): held whole and read with
    /// [`parse_free`] over these names once complete.
    free: Option<Vec<String>>,
}

impl StreamState {
    /// An empty output.
    pub fn new(syntax: ToolSyntax, text_allowed: bool) -> Self {
        StreamState {
            syntax,
            text_allowed,
            text: String::new(),
            sent_content: 0,
            sent_args: Vec::new(),
            free: None,
        }
    }

    /// An empty unconstrained output whose calls may name `names`: nothing is sent before
    /// the output is complete, since free text cannot be told from a call before it parses.
    pub fn free(syntax: ToolSyntax, names: Vec<String>) -> Self {
        StreamState {
            free: Some(names),
            ..Self::new(syntax, true)
        }
    }

    /// What the whole output `text` holds, read as this state reads it (the text pushed so
    /// far is not used).
    pub fn parse_whole(&self, text: &str) -> Parsed {
        match &self.free {
            Some(names) => parse_free(self.syntax, text, names),
            None => parse(self.syntax, text, self.text_allowed, true),
        }
    }

    /// Whether any call was announced.
    pub fn has_calls(&self) -> bool {
        !self.sent_args.is_empty()
    }

    /// Adds `piece` (`done`: the output is complete) and returns the deltas to send:
    /// `{"content": …}` and `{"tool_calls": [...]}` objects, `id(k)` naming call `k`.
    pub fn push(&mut self, piece: &str, done: bool, id: impl Fn(usize) -> String) -> Vec<Value> {
        self.text.push_str(piece);
        let p = match &self.free {
            Some(_) if !done => return Vec::new(),
            Some(_) => self.parse_whole(&self.text),
            None => parse(self.syntax, &self.text, self.text_allowed, done),
        };
        let mut deltas = Vec::new();
        if p.content.len() > self.sent_content {
            deltas.push(json!({"content": p.content[self.sent_content..]}));
            self.sent_content = p.content.len();
        }
        for (k, call) in p.calls.iter().enumerate() {
            if k == self.sent_args.len() {
                deltas.push(
                    json!({"tool_calls": [{"index": k, "id": id(k), "type": "function",
                    "function": {"name": call.name, "arguments": ""}}]}),
                );
                self.sent_args.push(0);
            }
            let sent = self.sent_args[k];
            if call.arguments.len() > sent {
                deltas.push(json!({"tool_calls": [{"index": k,
                    "function": {"arguments": call.arguments[sent..]}}]}));
                self.sent_args[k] = call.arguments.len();
            }
        }
        deltas
    }
}

/// A call's id: unique per request, sample and call.
pub fn call_id(request: u64, sample: usize, call: usize) -> String {
    format!("call_{request:016x}{sample:02x}{call:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(name: &str) -> Function {
        Function {
            name: name.into(),
            description: Some("d".into()),
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn list_calls_parse_whole_and_in_pieces() {
        let s = ToolSyntax::List;
        let text = r#"<tool_call>[{"name": "get_weather", "arguments": {"city":"Paris, \"FR\" {"}}, {"name": "t", "arguments": {}}]</tool_call>"#;
        let p = parse(s, text, false, true);
        assert!(!p.malformed);
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&p.calls[0].arguments).unwrap()["city"],
            "Paris, \"FR\" {"
        );
        assert_eq!(p.calls[1].arguments, "{}");
        // Streamed one character at a time, the deltas add up to the same calls.
        let mut st = StreamState::new(s, true);
        let mut args = vec![String::new(); 2];
        let mut names = Vec::new();
        let full = format!("Let me look. {text}");
        let chars: Vec<char> = full.chars().collect();
        for (i, c) in chars.iter().enumerate() {
            for d in st.push(&c.to_string(), i + 1 == chars.len(), |k| format!("id{k}")) {
                if let Some(tc) = d.get("tool_calls") {
                    let k = tc[0]["index"].as_u64().unwrap() as usize;
                    if let Some(n) = tc[0]["function"].get("name") {
                        names.push(n.as_str().unwrap().to_string());
                    }
                    args[k].push_str(tc[0]["function"]["arguments"].as_str().unwrap());
                } else {
                    assert!(names.is_empty(), "content after a call: {d}");
                }
            }
        }
        assert_eq!(names, ["get_weather", "t"]);
        assert_eq!(args[0], p.calls[0].arguments);
        assert_eq!(args[1], "{}");
    }

    #[test]
    fn text_is_held_back_only_while_it_could_open_a_call() {
        let s = ToolSyntax::List;
        assert_eq!(parse(s, "Hi <tool_", true, false).content, "Hi ");
        assert_eq!(parse(s, "Hi <tool_", true, true).content, "Hi <tool_");
        assert_eq!(parse(s, "Hi <b>", true, false).content, "Hi <b>");
        let p = parse(s, "x <tool_call>[{\"name\": \"a\", \"argu", true, false);
        assert_eq!(p.content, "x ");
        assert_eq!(p.calls, vec![]);
        assert!(!p.malformed);
    }

    #[test]
    fn hermes_calls_parse() {
        let s = ToolSyntax::Hermes;
        let one = "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>";
        let p = parse(s, &format!("{one}\n{one}"), true, true);
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[1].arguments, "{\"x\": [1, 2]}");
        assert!(!p.malformed);
        let p = parse(s, &format!("{one} junk"), true, true);
        assert_eq!(p.calls.len(), 1);
        assert!(p.malformed);
    }

    #[test]
    fn llama3_calls_parse_and_the_syntax_is_detected() {
        let s = ToolSyntax::Llama3;
        let text =
            r#"Sure. {"name": "a", "parameters": {"x": "}"}}; {"name": "b", "parameters": {}}"#;
        let p = parse(s, text, true, true);
        assert_eq!(p.content, "Sure. ");
        assert_eq!(p.calls.len(), 2);
        assert_eq!(p.calls[0].arguments, r#"{"x": "}"}"#);
        assert!(!p.malformed);
        let llama = "{%- if tools %}<|start_header_id|>ipython{% endif %}";
        assert_eq!(ToolSyntax::of_template(Some(llama)), ToolSyntax::Llama3);
        let qwen = "{%- if tools %}<tool_call>{% endif %}";
        assert_eq!(ToolSyntax::of_template(Some(qwen)), ToolSyntax::Hermes);
        assert_eq!(
            ToolSyntax::of_template(Some("{{ messages }}")),
            ToolSyntax::List
        );
        assert_eq!(ToolSyntax::of_template(None), ToolSyntax::List);
    }

    #[test]
    fn parser_survives_any_text() {
        for t in [
            "<tool_call>[{\"name\": \"\\u12",
            "<tool_call>[{\"name\": 5",
            "<tool_call>[{\"name\": \"a\", \"arguments\": }]",
            "<tool_call>[{\"name\": \"a\", \"arguments\": {\"é\": \"\\\"}",
            "<tool_call>",
            "",
        ] {
            for done in [false, true] {
                let _ = parse(ToolSyntax::List, t, true, done);
                let _ = parse(ToolSyntax::Hermes, t, false, done);
                let _ = parse(ToolSyntax::Llama3, t, true, done);
            }
        }
    }

    #[test]
    fn grammar_and_parser_agree_on_the_layout() {
        // What `grammar` enforces is what `parse` reads: build the text the grammar's
        // literals spell and parse it back.
        for syntax in [ToolSyntax::List, ToolSyntax::Hermes, ToolSyntax::Llama3] {
            let a = f("a");
            let g = grammar(
                syntax,
                &[&a],
                &CallRules {
                    text_allowed: true,
                    parallel: true,
                },
            );
            let call = |args: &str| format!("{}{args}{}", g.tags[0].begin, g.tags[0].end);
            let text = format!(
                "{}{}{}{}{}",
                g.open,
                call("{\"k\":1}"),
                g.separator,
                call("{}"),
                g.close
            );
            let p = parse(syntax, &text, true, true);
            assert_eq!(p.calls.len(), 2, "{syntax:?}: {text}");
            assert!(!p.malformed);
            assert_eq!(p.calls[0].arguments, "{\"k\":1}");
            assert_eq!(
                calls_text(
                    syntax,
                    &[("a".into(), "{\"k\":1}".into()), ("a".into(), "{}".into())]
                ),
                text
            );
        }
    }

    #[test]
    fn prompts_carry_tools_and_past_calls() {
        let a = f("get_weather");
        let rules = CallRules {
            text_allowed: true,
            parallel: false,
        };
        let msgs = vec![
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        ];
        let (m, tools) =
            prompt_messages(ToolSyntax::List, msgs.clone(), &[&a], Some(&rules)).unwrap();
        assert!(tools.is_none());
        assert_eq!(m[0]["role"], "system");
        assert!(m[0]["content"]
            .as_str()
            .unwrap()
            .contains("\"get_weather\""));
        assert_eq!(
            m[2]["content"],
            "<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}]</tool_call>"
        );
        let (m, tools) = prompt_messages(ToolSyntax::Hermes, msgs, &[&a], Some(&rules)).unwrap();
        assert!(tools.is_some());
        assert_eq!(
            m[1]["tool_calls"][0]["function"]["arguments"]["city"],
            "Paris"
        );
        let bad = vec![
            json!({"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "{"}}]}),
        ];
        let e = prompt_messages(ToolSyntax::List, bad, &[], None).unwrap_err();
        assert!(e.to_string().contains("messages[0].tool_calls"), "{e}");
    }

    #[test]
    fn free_output_is_parsed_when_it_parses() {
        let names = vec!["a".to_string(), "b".to_string()];
        let p = parse_free(
            ToolSyntax::List,
            r#"ok <tool_call>[{"name": "a", "arguments": {"x": 1}}]</tool_call>"#,
            &names,
        );
        assert_eq!(p.content, "ok ");
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].arguments, r#"{"x":1}"#);
        let p = parse_free(ToolSyntax::Hermes, "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"a\", \"parameters\": {}}\n</tool_call>", &names);
        assert_eq!(p.calls.len(), 2);
        let p = parse_free(
            ToolSyntax::List,
            r#"<tool_call>[{"name": "zz", "arguments": {}}"#,
            &names,
        );
        assert!(p.calls.is_empty() && p.malformed);
        assert_eq!(p.content, r#"<tool_call>[{"name": "zz", "arguments": {}}"#);
        assert!(parse_free(ToolSyntax::List, "plain", &names)
            .calls
            .is_empty());
        let p = parse_free(
            ToolSyntax::Llama3,
            r#"{"name": "a", "parameters": {"x": 2}}"#,
            &names,
        );
        assert_eq!(p.calls.len(), 1);
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("uber.ride-2_x", "f").is_ok());
        assert!(check_name("", "f").is_err());
        assert!(check_name("a b", "f").is_err());
        assert!(check_name(&"a".repeat(65), "f").is_err());
    }
}
