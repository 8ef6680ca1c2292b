"""Chat templates as role prefixes and suffixes, the shape SGLang's frontend programs need.

A program writes a chat turn as ``s += sgl.user("Hi")``: the state appends the role's prefix,
the content, then the role's suffix. `ChatTemplate` holds those strings. They come from, in
order of preference:

1. a template named by the caller (``RuntimeEndpoint(url, chat_template_name="chatml")``),
   from the same registry names SGLang's frontend uses;
2. the model's own Jinja chat template (from the server, the in-process engine, or the model
   file), turned into prefixes and suffixes by rendering sentinel conversations
   (`ChatTemplate.from_jinja`);
3. a match on the model path, as SGLang does, and finally the ``default`` template.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

Message = Mapping[str, Any]
RenderFn = Callable[[List[Dict[str, str]]], str]


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Role prefixes/suffixes, an optional default system prompt and the stop strings."""

    name: str
    role_prefix_and_suffix: Mapping[str, Tuple[str, str]]
    default_system_prompt: Optional[str] = None
    stop_str: Tuple[str, ...] = ()

    def get_prefix_and_suffix(
        self, role: str, hist_messages: Sequence[Message]
    ) -> Tuple[str, str]:
        """The prefix and suffix of a `role` message after `hist_messages`."""
        del hist_messages  # plain templates do not depend on the history
        return self.role_prefix_and_suffix.get(role, ("", ""))

    def get_prompt(self, messages: Sequence[Message]) -> str:
        """Render a whole conversation (a `None` system content means the default)."""
        prompt = ""
        for i, message in enumerate(messages):
            role, content = message["role"], message["content"]
            if role == "system" and content is None:
                content = self.default_system_prompt
                if content is None:
                    continue
            prefix, suffix = self.get_prefix_and_suffix(role, messages[:i])
            prompt += f"{prefix}{content}{suffix}"
        return prompt

    @staticmethod
    def from_jinja(
        name: str,
        render: RenderFn,
        stop_str: Tuple[str, ...] = (),
    ) -> "ChatTemplate":
        """Derive prefixes and suffixes from a renderer of whole conversations.

        `render(messages)` must render without a generation prompt. The derivation renders
        conversations whose contents are unique sentinels and cuts the output around them;
        it raises `ValueError` if the template does not render roles as
        ``prefix + content + suffix`` (e.g. it reorders or rewrites messages).
        """
        sys_t, usr_t, ast_t = "SGLRSxSYSTEMx7", "SGLRSxUSERx7", "SGLRSxASSISTANTx7"

        def cut(text: str, *marks: str) -> List[str]:
            parts: List[str] = []
            rest = text
            for m in marks:
                i = rest.find(m)
                if i < 0:
                    raise ValueError(f"chat template {name!r} dropped a message content")
                parts.append(rest[:i])
                rest = rest[i + len(m) :]
            parts.append(rest)
            return parts

        full = render(
            [
                {"role": "system", "content": sys_t},
                {"role": "user", "content": usr_t},
                {"role": "assistant", "content": ast_t},
            ]
        )
        sys_pre, sys_to_usr, usr_to_ast, ast_suf = cut(full, sys_t, usr_t, ast_t)
        sys_alone = cut(render([{"role": "system", "content": sys_t}]), sys_t)
        sys_suf = sys_alone[1]
        usr_pair = cut(
            render([{"role": "user", "content": usr_t}, {"role": "assistant", "content": ast_t}]),
            usr_t,
            ast_t,
        )
        ast_pre_candidates = usr_to_ast
        if not sys_to_usr.startswith(sys_suf):
            raise ValueError(f"chat template {name!r} is not a prefix/suffix template")
        usr_pre = sys_to_usr[len(sys_suf) :]
        # Between the user content and the assistant content: user suffix + assistant prefix.
        # The user suffix ends where a user-only conversation ends.
        usr_alone = cut(render([{"role": "user", "content": usr_t}]), usr_t)
        usr_suf = usr_alone[1]
        if not ast_pre_candidates.startswith(usr_suf):
            raise ValueError(f"chat template {name!r} is not a prefix/suffix template")
        ast_pre = ast_pre_candidates[len(usr_suf) :]
        # A template that adds a system turn when the first message is not a system one.
        default_system: Optional[str] = None
        lead = usr_pair[0]
        if lead.endswith(usr_pre) and lead[: len(lead) - len(usr_pre)]:
            injected = lead[: len(lead) - len(usr_pre)]
            if injected.startswith(sys_pre) and injected.endswith(sys_suf):
                default_system = injected[len(sys_pre) : len(injected) - len(sys_suf)]
        roles = {
            "system": (sys_pre, sys_suf),
            "user": (usr_pre, usr_suf),
            "assistant": (ast_pre, ast_suf),
        }
        stops = tuple(stop_str)
        if not stops and ast_suf.strip():
            stops = (ast_suf.strip(),)
        return ChatTemplate(
            name=name,
            role_prefix_and_suffix=roles,
            default_system_prompt=default_system,
            stop_str=stops,
        )


def jinja_renderer(
    source: str, bos_token: str = "", eos_token: str = ""
) -> RenderFn:
    """A `RenderFn` for a Hugging Face style Jinja chat template (needs `jinja2`)."""
    import jinja2
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True
    )
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, indent=indent)
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(source)

    def render(messages: List[Dict[str, str]]) -> str:
        return template.render(
            messages=messages,
            add_generation_prompt=False,
            bos_token=bos_token,
            eos_token=eos_token,
        )

    return render


_REGISTRY: Dict[str, ChatTemplate] = {}


def register_chat_template(template: ChatTemplate) -> None:
    """Add (or replace) a named template."""
    _REGISTRY[template.name] = template


def get_chat_template(name: str) -> ChatTemplate:
    """A registered template by name; `KeyError` names the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown chat template {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def _chatml_roles() -> Dict[str, Tuple[str, str]]:
    return {
        r: (f"<|im_start|>{r}\n", "<|im_end|>\n") for r in ("system", "user", "assistant")
    }


def _llama3_roles() -> Dict[str, Tuple[str, str]]:
    return {
        r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>")
        for r in ("system", "user", "assistant")
    }


register_chat_template(
    ChatTemplate(
        name="default",
        role_prefix_and_suffix={
            "system": ("SYSTEM:", "\n"),
            "user": ("USER:", "\n"),
            "assistant": ("ASSISTANT:", "\n"),
        },
    )
)
register_chat_template(
    ChatTemplate(name="chatml", role_prefix_and_suffix=_chatml_roles(), stop_str=("<|im_end|>",))
)
register_chat_template(
    ChatTemplate(
        name="qwen",
        role_prefix_and_suffix=_chatml_roles(),
        default_system_prompt="You are a helpful assistant.",
        stop_str=("<|im_end|>",),
    )
)
register_chat_template(
    ChatTemplate(
        name="llama-3-instruct",
        role_prefix_and_suffix=_llama3_roles(),
        stop_str=("<|eot_id|>",),
    )
)
register_chat_template(
    ChatTemplate(
        name="gemma-it",
        role_prefix_and_suffix={
            "system": ("", ""),
            "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
            "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n"),
        },
    )
)


def chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """SGLang's rule of thumb: pick a registered template from words in the model path."""
    p = model_path.lower()
    if "tinyllama" in p:
        return get_chat_template("chatml")
    if "qwen" in p and ("chat" in p or "instruct" in p) and "vl" not in p and "llava" not in p:
        return get_chat_template("qwen")
    if "llama-3" in p and "instruct" in p:
        return get_chat_template("llama-3-instruct")
    if "gemma" in p and "it" in p:
        return get_chat_template("gemma-it")
    return get_chat_template("default")


def read_local_chat_template(model_path: str) -> Optional[Tuple[str, str, str]]:
    """The Jinja chat template (with BOS and EOS text) of a local model, if there is one.

    Reads ``tokenizer.chat_template`` from a GGUF file's metadata, or ``chat_template`` from
    an HF folder's ``tokenizer_config.json``. Returns `None` when the path is not local or
    has no template.
    """
    try:
        if os.path.isdir(model_path):
            cfg_path = os.path.join(model_path, "tokenizer_config.json")
            if not os.path.exists(cfg_path):
                return None
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
            tpl = cfg.get("chat_template")
            if not isinstance(tpl, str):
                return None

            def tok_text(v: Any) -> str:
                if isinstance(v, dict):
                    return str(v.get("content", ""))
                return str(v or "")

            return tpl, tok_text(cfg.get("bos_token")), tok_text(cfg.get("eos_token"))
        if os.path.isfile(model_path) and model_path.endswith(".gguf"):
            return _gguf_chat_template(model_path)
    except (OSError, ValueError, struct.error):
        return None
    return None


_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def _gguf_chat_template(path: str) -> Optional[Tuple[str, str, str]]:
    """Read the chat template and BOS/EOS token texts from a GGUF file's header."""
    with open(path, "rb") as f:

        def read(n: int) -> bytes:
            b = f.read(n)
            if len(b) != n:
                raise ValueError("truncated GGUF header")
            return b

        def read_str() -> str:
            (n,) = struct.unpack("<Q", read(8))
            return read(n).decode("utf-8", "replace")

        def skip_or_read(t: int, keep: bool) -> Any:
            if t == 8:
                return read_str()
            if t == 9:
                et, n = struct.unpack("<IQ", read(12))
                if keep:
                    return [skip_or_read(et, True) for _ in range(n)]
                if et in _GGUF_SCALARS:
                    f.seek(n * struct.calcsize("<" + _GGUF_SCALARS[et]), 1)
                else:
                    for _ in range(n):
                        skip_or_read(et, False)
                return None
            if t not in _GGUF_SCALARS:
                raise ValueError(f"unknown GGUF value type {t}")
            fmt = "<" + _GGUF_SCALARS[t]
            return struct.unpack(fmt, read(struct.calcsize(fmt)))[0]

        magic, _version, _n_tensors, n_kv = struct.unpack("<4sIQQ", read(24))
        if magic != b"GGUF":
            raise ValueError("not a GGUF file")
        template: Optional[str] = None
        bos_id: Optional[int] = None
        eos_id: Optional[int] = None
        tokens: Optional[List[str]] = None
        for _ in range(n_kv):
            key = read_str()
            (t,) = struct.unpack("<I", read(4))
            keep = key in (
                "tokenizer.chat_template",
                "tokenizer.ggml.bos_token_id",
                "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.tokens",
            )
            value = skip_or_read(t, keep)
            if key == "tokenizer.chat_template":
                template = str(value)
            elif key == "tokenizer.ggml.bos_token_id":
                bos_id = int(value)
            elif key == "tokenizer.ggml.eos_token_id":
                eos_id = int(value)
            elif key == "tokenizer.ggml.tokens":
                tokens = list(value)
        if template is None:
            return None

        def text(i: Optional[int]) -> str:
            if tokens is None or i is None or not 0 <= i < len(tokens):
                return ""
            return tokens[i]

        return template, text(bos_id), text(eos_id)
