//! `/v1/chat/completions`: messages through the chat template, `response_format`, tools.

use super::tools::{self, CallRules, Function, StreamState};
use super::*;
use crate::auth::Tenant;
use axum::Extension;

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
    image_url: Option<Value>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct RawMessage {
    role: String,
    content: Option<Content>,
    name: Option<String>,
    tool_calls: Option<Value>,
    tool_call_id: Option<String>,
    /// The fields of an assistant message as OpenAI's, vLLM's and SGLang's responses carry
    /// them, so that a client can send a response's message back as it is (`model_dump()`
    /// of the openai client's message writes every one, mostly `null`). `refusal`: what the
    /// assistant said instead of content; the others are honoured when empty and refused by
    /// name otherwise (see `message_json`).
    refusal: Option<String>,
    audio: Option<Value>,
    function_call: Option<Value>,
    annotations: Option<Value>,
    reasoning_content: Option<String>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct RawJsonSchemaFormat {
    name: Option<String>,
    description: Option<String>,
    schema: Option<Value>,
    strict: Option<bool>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct ResponseFormat {
    #[serde(rename = "type")]
    kind: String,
    json_schema: Option<RawJsonSchemaFormat>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct FunctionDef {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
    strict: Option<bool>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct Tool {
    #[serde(rename = "type")]
    kind: String,
    function: FunctionDef,
}

#[derive(Deserialize, Debug)]
struct RawChat {
    model: Option<String>,
    messages: Vec<RawMessage>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    response_format: Option<ResponseFormat>,
    tools: Option<Vec<Tool>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
    user: Option<String>,
    /// Cache namespace (vLLM's `cache_salt`).
    cache_salt: Option<String>,
    /// SGLang's extension: continue the last (assistant) message instead of opening a new
    /// turn. Not supported: only `false` is accepted.
    continue_final_message: Option<bool>,
    /// SGLang's reasoning extensions (sglang-router sends them on every request). sglrs has
    /// no reasoning parser, so there is never reasoning text to separate or stream apart:
    /// either value gives the same answer, as SGLang's does without `--reasoning-parser`.
    separate_reasoning: Option<bool>,
    /// See `separate_reasoning`.
    stream_reasoning: Option<bool>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(flatten)]
    rest: serde_json::Map<String, Value>,
}

impl HasRest for RawChat {
    fn rest(&self) -> &serde_json::Map<String, Value> {
        &self.rest
    }
}

/// How tools shape the output.
#[derive(Clone, Debug, PartialEq)]
enum ToolMode {
    /// No tools (or `tool_choice: "none"`).
    None,
    /// The model may answer or call a tool (detected in the output).
    Auto(Vec<String>),
    /// The model must call one of the tools.
    Required(Vec<String>),
    /// The model calls this function.
    Named(String),
}

impl ToolMode {
    /// The rules its grammar enforces (`None`: no tools).
    fn rules(&self, parallel: bool) -> Option<CallRules> {
        match self {
            ToolMode::None => None,
            ToolMode::Auto(_) => Some(CallRules {
                text_allowed: true,
                parallel,
            }),
            ToolMode::Required(_) => Some(CallRules {
                text_allowed: false,
                parallel,
            }),
            // A named choice is one call of that function.
            ToolMode::Named(_) => Some(CallRules {
                text_allowed: false,
                parallel: false,
            }),
        }
    }

    /// Whether the output may be text rather than calls.
    fn text_allowed(&self) -> bool {
        matches!(self, ToolMode::None | ToolMode::Auto(_))
    }
}

/// How the output of a request in `mode` is read back: exactly, as the grammar enforces it,
/// or out of free output (`--disable-tool-grammar`); `None` without tools.
fn reader(state: &AppState, mode: &ToolMode) -> Option<StreamState> {
    let syntax = state.tool_syntax;
    Some(match mode {
        ToolMode::None => return None,
        ToolMode::Auto(names) | ToolMode::Required(names) if !state.tool_grammar => {
            StreamState::free(syntax, names.clone())
        }
        ToolMode::Named(name) if !state.tool_grammar => {
            StreamState::free(syntax, vec![name.clone()])
        }
        _ => StreamState::new(syntax, mode.text_allowed()),
    })
}

fn message_json((i, m): (usize, &RawMessage)) -> Result<Value, ApiError> {
    if !["system", "user", "assistant", "tool", "developer"].contains(&m.role.as_str()) {
        return Err(ApiError::bad(
            "messages",
            format!("unknown role {:?}", m.role),
        ));
    }
    let field = |f: &str| format!("messages[{i}].{f}");
    if m.audio.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad(
            field("audio"),
            "audio is not supported by this model",
        ));
    }
    if m.function_call.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad(
            field("function_call"),
            "the legacy function_call form is not supported; send tool_calls",
        ));
    }
    if m.annotations
        .as_ref()
        .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(ApiError::bad(
            field("annotations"),
            "only null or an empty list is accepted",
        ));
    }
    if m.reasoning_content
        .as_deref()
        .is_some_and(|r| !r.is_empty())
    {
        return Err(ApiError::bad(
            field("reasoning_content"),
            "this model has no reasoning to take back; only null or \"\" is accepted",
        ));
    }
    let refusal = m.refusal.as_deref().filter(|r| !r.is_empty());
    if refusal.is_some() && (m.role != "assistant" || m.content.is_some()) {
        return Err(ApiError::bad(
            field("refusal"),
            "a refusal stands for the content of an assistant message that has none",
        ));
    }
    let content = match &m.content {
        // An assistant's refusal is what it said.
        None if refusal.is_some() => json!(refusal),
        None => Value::Null,
        Some(Content::Text(t)) => json!(t),
        Some(Content::Parts(parts)) => {
            let mut s = String::new();
            for p in parts {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => s.push_str(t),
                    _ if p.image_url.is_some() || p.kind == "image_url" => {
                        return Err(ApiError::bad(
                            "messages",
                            "image content is not supported by this model",
                        ))
                    }
                    (k, _) => {
                        return Err(ApiError::bad(
                            "messages",
                            format!("unsupported content part type {k:?}"),
                        ))
                    }
                }
            }
            json!(s)
        }
    };
    let role = if m.role == "developer" {
        "system"
    } else {
        m.role.as_str()
    };
    let mut v = json!({"role": role, "content": content});
    if let Some(n) = &m.name {
        v["name"] = json!(n);
    }
    if let Some(tc) = &m.tool_calls {
        v["tool_calls"] = tc.clone();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    Ok(v)
}

fn render_prompt(
    state: &AppState,
    messages: &[Value],
    tools: Option<Value>,
) -> Result<String, ApiError> {
    match &state.chat_template {
        Some(t) => t
            .render(
                messages,
                &RenderOptions {
                    add_generation_prompt: true,
                    tools,
                    extra: Default::default(),
                },
            )
            .map_err(|e| ApiError::bad("messages", e.to_string())),
        None => {
            let mut s = String::new();
            for m in messages {
                s.push_str(&format!(
                    "{}: {}\n",
                    m["role"].as_str().unwrap_or(""),
                    m["content"].as_str().unwrap_or("")
                ));
            }
            s.push_str("assistant:");
            Ok(s)
        }
    }
}

fn chat_logprobs(state: &AppState, entries: &[TokenLogprob]) -> Value {
    let item = |id: u32, lp: f32| {
        let t = state.token_text(id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = item(e.token, e.logprob.unwrap_or(0.0));
            v["top_logprobs"] = Value::Array(e.top.iter().map(|&(id, l)| item(id, l)).collect());
            v
        })
        .collect();
    json!({"content": content})
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let start = Instant::now();
    state
        .metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let raw: RawChat = parse_body(&body)?;
    check_model(&state, raw.model.as_deref())?;
    let _ = &raw.user;
    let _ = (raw.separate_reasoning, raw.stream_reasoning);
    if raw.continue_final_message == Some(true) {
        return Err(ApiError::bad(
            "continue_final_message",
            "continuing the final message is not supported",
        ));
    }
    if raw.messages.is_empty() {
        return Err(ApiError::bad("messages", "is empty"));
    }
    let messages: Vec<Value> = raw
        .messages
        .iter()
        .enumerate()
        .map(message_json)
        .collect::<Result<_, _>>()?;
    let functions = check_tools(raw.tools.as_deref().unwrap_or_default())?;
    let mode = tool_choice_mode(raw.tool_choice.as_ref(), &functions)?;
    let rules = mode.rules(raw.parallel_tool_calls.unwrap_or(true));
    let syntax = state.tool_syntax;
    let listed: Vec<&Function> = functions.iter().collect();
    let (messages, tools_json) = tools::prompt_messages(syntax, messages, &listed, rules.as_ref())?;
    let prompt = render_prompt(&state, &messages, tools_json)?;
    let input_ids = state.encode(&prompt)?;
    let job = chat_job(&state, &raw, &mode, rules.as_ref(), &functions, input_ids)?;
    let want_lp = job.logprobs.is_some();
    let running = dispatch::submit(&state, &tenant.unwrap_or_default().0, job).await?;
    let id = format!("chatcmpl-{:016x}", running.id);
    let running_id = running.id;
    let model = state.info.served_model_name.clone();
    let created = now_secs();
    if raw.stream.unwrap_or(false) {
        let include_usage = raw
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        return Ok(stream_chat(
            state,
            running,
            id,
            model,
            created,
            mode,
            include_usage,
            want_lp,
            start,
        ));
    }
    let all = dispatch::collect_all(&state, vec![running], start).await;
    fail_on_abort(&all)?;
    let results = &all[0];
    let choices = chat_choices(&state, results, &mode, running_id, want_lp);
    Ok(Json(
        json!({"id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage(results)}),
    )
    .into_response())
}

/// Checks the tools: function tools with distinct, well-formed names and object schemas.
fn check_tools(tools: &[Tool]) -> Result<Vec<Function>, ApiError> {
    let mut out: Vec<Function> = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::bad(
                "tools",
                format!(
                    "tool type {:?} is not supported (only \"function\")",
                    t.kind
                ),
            ));
        }
        let f = &t.function;
        tools::check_name(&f.name, &format!("tools[{i}].function.name"))?;
        if out.iter().any(|o| o.name == f.name) {
            return Err(ApiError::bad(
                "tools",
                format!("two tools are named {:?}", f.name),
            ));
        }
        // `strict` asks for the schema to be followed exactly: sglrs's enforcement always
        // does, so both values give the same output.
        let _ = f.strict;
        let parameters = object_parameters(f.parameters.as_ref())
            .map_err(|m| ApiError::bad(format!("tools[{i}].function.parameters"), m))?;
        out.push(Function {
            name: f.name.clone(),
            description: f.description.clone(),
            parameters,
        });
    }
    Ok(out)
}

/// The schema a function's arguments are enforced with. Arguments are a JSON object
/// (OpenAI's `function.arguments` is the text of one, and clients pass it on as keyword
/// arguments), so a schema that leaves the type open (`{}`, or `properties` without `type`,
/// which JSON Schema would let match a number or a string) gets `type: object`, a type list
/// is narrowed to its `object`, and a schema that cannot describe an object is refused.
/// Omitted `parameters` mean a function of no declared parameters: any object.
fn object_parameters(p: Option<&Value>) -> Result<Value, String> {
    let mut m = match p {
        None => return Ok(json!({"type": "object"})),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err("is not a JSON Schema object".into()),
    };
    let object = match m.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => return Err("`type` is neither a type name nor a list of them".into()),
    };
    if !object {
        return Err(format!(
            "function arguments are a JSON object, but `type` is {}",
            m["type"]
        ));
    }
    m.insert("type".into(), json!("object"));
    Ok(Value::Object(m))
}

/// How `tool_choice` (and the presence of tools) shapes the output.
fn tool_choice_mode(choice: Option<&Value>, tools: &[Function]) -> Result<ToolMode, ApiError> {
    let names: Vec<String> = tools.iter().map(|t| t.name.clone()).collect();
    Ok(match (choice, tools.is_empty()) {
        (None, true) | (Some(Value::Null), true) => ToolMode::None,
        (Some(Value::String(s)), _) if s == "none" => ToolMode::None,
        (None, false) | (Some(Value::Null), false) => ToolMode::Auto(names),
        (Some(Value::String(s)), false) if s == "auto" => ToolMode::Auto(names),
        (Some(Value::String(s)), false) if s == "required" => ToolMode::Required(names),
        (Some(Value::Object(o)), false) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ApiError::bad(
                        "tool_choice",
                        "expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            if !names.iter().any(|n| n == name) {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("no tool named {:?} in tools", tools::excerpt(name)),
                ));
            }
            ToolMode::Named(name.to_string())
        }
        (Some(other), true) if !other.is_null() => {
            return Err(ApiError::bad("tool_choice", "given without tools"));
        }
        (Some(other), _) => {
            return Err(ApiError::bad(
                "tool_choice",
                format!("unsupported value {}", tools::excerpt(&other.to_string())),
            ))
        }
    })
}

/// The grammar `response_format` asks for, if any.
fn response_format_grammar(rf: Option<&ResponseFormat>) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(rf) = rf else {
        return Ok(None);
    };
    Ok(match rf.kind.as_str() {
        "text" => None,
        "json_object" => Some(GrammarSpec::JsonObject),
        "json_schema" => {
            let js = rf
                .json_schema
                .as_ref()
                .ok_or_else(|| ApiError::bad("response_format", "json_schema is missing"))?;
            let _ = (&js.name, &js.description, js.strict);
            let schema = js
                .schema
                .as_ref()
                .ok_or_else(|| ApiError::bad("response_format", "json_schema.schema is missing"))?;
            Some(GrammarSpec::JsonSchema(schema.to_string()))
        }
        other => {
            return Err(ApiError::bad(
                "response_format",
                format!("type {other:?} is not supported"),
            ))
        }
    })
}

/// The output constraint: `response_format`, or the tool-call grammar `tool_choice` and
/// `parallel_tool_calls` imply (the two cannot be combined).
fn output_grammar(
    state: &AppState,
    rf: Option<&ResponseFormat>,
    mode: &ToolMode,
    rules: Option<&CallRules>,
    functions: &[Function],
) -> Result<Option<GrammarSpec>, ApiError> {
    let grammar = response_format_grammar(rf)?;
    let Some(rules) = rules.filter(|_| state.tool_grammar) else {
        return Ok(grammar);
    };
    if grammar.is_some() {
        return Err(ApiError::bad(
            "response_format",
            "cannot be combined with tools (unless tool_choice is \"none\")",
        ));
    }
    let callable: Vec<&Function> = match mode {
        ToolMode::Named(name) => functions.iter().filter(|f| &f.name == name).collect(),
        _ => functions.iter().collect(),
    };
    Ok(Some(GrammarSpec::Tagged(tools::grammar(
        state.tool_syntax,
        &callable,
        rules,
    ))))
}

/// The scheduler job of a chat request: sampling parameters, the output constraint and the
/// logprobs asked for.
fn chat_job(
    state: &AppState,
    raw: &RawChat,
    mode: &ToolMode,
    rules: Option<&CallRules>,
    functions: &[Function],
    input_ids: Vec<u32>,
) -> Result<Job, ApiError> {
    let grammar = output_grammar(state, raw.response_format.as_ref(), mode, rules, functions)?;
    // Both limits (the deprecated and the new name) must agree: honouring one would drop
    // the other without a word.
    if let (Some(a), Some(b)) = (raw.max_completion_tokens, raw.max_tokens) {
        if a != b {
            return Err(ApiError::bad(
                "max_completion_tokens",
                format!("{a} disagrees with max_tokens {b}; send one of them"),
            ));
        }
    }
    let max_name = if raw.max_completion_tokens.is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    let sp = raw
        .sampling
        .to_raw(raw.max_completion_tokens.or(raw.max_tokens))?;
    let mut params = validate::check_params(&sp, input_ids.len(), state.limits(), max_name)?;
    if let Some(g) = grammar {
        if params.grammar.is_some() {
            return Err(ApiError::invalid(
                "give only one of response_format / tools, regex and ebnf",
            ));
        }
        params.grammar = Some(g);
    }
    let want_lp = raw.logprobs.unwrap_or(false);
    if raw.top_logprobs.is_some() && !want_lp {
        return Err(ApiError::bad("top_logprobs", "requires logprobs: true"));
    }
    let logprobs = validate::check_logprobs(
        want_lp,
        None,
        raw.top_logprobs,
        None,
        input_ids.len(),
        state.limits(),
    )?;
    Ok(Job {
        input_ids,
        params,
        logprobs,
        priority: 0,
        namespace: validate::cache_salt(raw.cache_salt.as_deref())?,
        bootstrap: raw.sampling.bootstrap(state, 1)?,
    })
}

/// The finish reason of a sample that called tools: `tool_calls`, unless the output was
/// cut (by length or an abort), which stays visible.
fn tool_finish(reason: Option<&FinishReason>) -> Value {
    match reason {
        Some(FinishReason::Length(_)) | Some(FinishReason::Abort(_)) => finish_str(reason),
        _ => json!("tool_calls"),
    }
}

/// The `choices` of a non-streamed answer: text, or the calls read from the output.
fn chat_choices(
    state: &AppState,
    results: &[SampleResult],
    mode: &ToolMode,
    request: u64,
    want_lp: bool,
) -> Vec<Value> {
    let mut choices = Vec::new();
    for (i, r) in results.iter().enumerate() {
        let parsed = reader(state, mode).map(|st| st.parse_whole(&r.text));
        let (message, finish) = match parsed {
            Some(p) if !p.calls.is_empty() => {
                let calls: Vec<Value> = p
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| {
                        json!({"id": tools::call_id(request, i, k), "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                let content = p.content.trim();
                let content = if content.is_empty() {
                    Value::Null
                } else {
                    json!(content)
                };
                (
                    json!({"role": "assistant", "content": content, "tool_calls": calls}),
                    tool_finish(r.finish.as_ref()),
                )
            }
            _ => (
                json!({"role": "assistant", "content": r.text}),
                finish_str(r.finish.as_ref()),
            ),
        };
        choices.push(json!({"index": i, "message": message,
            "logprobs": if want_lp { chat_logprobs(state, &r.logprobs) } else { Value::Null },
            "finish_reason": finish, "matched_stop": matched_stop(r.finish.as_ref())}));
    }
    choices
}

#[allow(clippy::too_many_arguments)]
fn stream_chat(
    state: Arc<AppState>,
    mut job: dispatch::Running,
    id: String,
    model: String,
    created: u64,
    mode: ToolMode,
    include_usage: bool,
    want_lp: bool,
    start: Instant,
) -> Response {
    let (tx, resp) = sse::channel();
    sse::spawn(tx.clone(), async move {
        let chunk = |index: usize, delta: Value, finish: Value, lp: Value| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]})
            .to_string()
        };
        let tools_on = mode != ToolMode::None;
        // Without tools the states stay unused (text goes out as it comes).
        let mut streams: Vec<StreamState> = (0..job.n)
            .map(|_| {
                reader(&state, &mode).unwrap_or_else(|| StreamState::new(state.tool_syntax, true))
            })
            .collect();
        for i in 0..job.n {
            let delta = if mode.text_allowed() {
                json!({"role": "assistant", "content": ""})
            } else {
                json!({"role": "assistant", "content": null})
            };
            if tx
                .send(chunk(i, delta, Value::Null, Value::Null))
                .await
                .is_err()
            {
                return;
            }
        }
        let request = job.id;
        let mut results = job.results();
        let mut timing = Timing::new(start);
        while results.iter().any(|r| r.finish.is_none()) {
            let Ok(ev) = sse::recv(&mut job.rx, &tx).await else {
                return; // client gone: dropping `job.rx` aborts the request
            };
            let Some(ev) = ev else { break };
            let mut msgs: Vec<String> = Vec::new();
            match &ev {
                SchedEvent::Delta {
                    sample,
                    text,
                    tokens,
                    logprobs,
                    ..
                } => {
                    if !tokens.is_empty() {
                        timing.on_tokens(&state);
                    }
                    let mut lp = if want_lp && !logprobs.is_empty() {
                        chat_logprobs(&state, logprobs)
                    } else {
                        Value::Null
                    };
                    let deltas = if tools_on {
                        streams[*sample].push(text, false, |k| tools::call_id(request, *sample, k))
                    } else if text.is_empty() {
                        Vec::new()
                    } else {
                        vec![json!({"content": text})]
                    };
                    for d in deltas {
                        msgs.push(chunk(*sample, d, Value::Null, std::mem::take(&mut lp)));
                    }
                    if !lp.is_null() {
                        msgs.push(chunk(*sample, json!({}), Value::Null, lp));
                    }
                }
                SchedEvent::Finished { sample, reason, .. } => {
                    let st = &mut streams[*sample];
                    if tools_on {
                        for d in st.push("", true, |k| tools::call_id(request, *sample, k)) {
                            msgs.push(chunk(*sample, d, Value::Null, Value::Null));
                        }
                    }
                    let f = if st.has_calls() {
                        tool_finish(Some(reason))
                    } else {
                        finish_str(Some(reason))
                    };
                    msgs.push(chunk(*sample, json!({}), f, Value::Null));
                }
                SchedEvent::InputLogprobs { .. } | SchedEvent::KvExport { .. } => {}
            };
            dispatch::apply(&mut results, ev);
            for m in msgs {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        }
        state.metrics.e2e.observe(timing.elapsed());
        if include_usage {
            let c = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [], "usage": usage(&results)});
            let _ = tx.send(c.to_string()).await;
        }
        let _ = tx.send("[DONE]".to_string()).await;
    });
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_arguments_are_always_objects() {
        let p = |v: Value| object_parameters(Some(&v));
        assert_eq!(object_parameters(None).unwrap(), json!({"type": "object"}));
        assert_eq!(p(json!({})).unwrap(), json!({"type": "object"}));
        let props = json!({"properties": {"x": {"type": "string"}}, "required": ["x"]});
        let typed = p(props).unwrap();
        assert_eq!(typed["type"], "object");
        assert_eq!(typed["required"], json!(["x"]));
        assert_eq!(
            p(json!({"type": ["object", "null"]})).unwrap(),
            json!({"type": "object"})
        );
        assert!(p(json!({"type": "string"}))
            .unwrap_err()
            .contains("\"string\""));
        assert!(p(json!({"type": ["array", "null"]})).is_err());
        assert!(p(json!({"type": 3})).is_err());
        assert!(p(json!([])).is_err());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let e = parse_body::<RawChat>(br#"{"messages": [], "frobnicate": 1}"#).unwrap_err();
        assert!(e.to_string().contains("frobnicate"));
        let ok = parse_body::<RawChat>(br#"{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}"#);
        assert!(ok.is_ok());
        // The shared sampling fields are read through the flattened struct, with their types.
        let v = parse_body::<RawChat>(
            br#"{"messages": [], "temperature": 0.5, "top_k": 3, "stop": ["x"], "seed": 7}"#,
        )
        .unwrap();
        assert_eq!(v.sampling.temperature, Some(0.5));
        assert_eq!(v.sampling.top_k, Some(3));
        assert_eq!(v.sampling.seed, Some(7));
        let e = parse_body::<RawChat>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::BAD_REQUEST);
        // A field of the other endpoint is unknown here.
        let e = parse_body::<RawChat>(br#"{"messages": [], "echo": true}"#).unwrap_err();
        assert!(e.to_string().contains("`echo`"), "{e}");
        let e = parse_body::<RawCompletion>(br#"{"prompt": "a", "tools": []}"#).unwrap_err();
        assert!(e.to_string().contains("`tools`"), "{e}");
        assert!(
            parse_body::<RawCompletion>(br#"{"prompt": [1, 2], "n": 2, "echo": true}"#).is_ok()
        );
    }
}
