"""sglrs: run SGLang frontend programs on sglrs, over HTTP or inside this process.

``import sglrs as sgl`` gives the names of SGLang's frontend::

    import sglrs as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=32))

    sgl.set_default_backend(sgl.RuntimeEndpoint("http://127.0.0.1:30000"))
    state = qa.run(question="What is the capital of France?", temperature=0)
    print(state["answer"])
"""

from sglrs._native import __version__
from sglrs.backend.base import BackendError, BaseBackend
from sglrs.backend.engine import Engine
from sglrs.backend.runtime_endpoint import RuntimeEndpoint
from sglrs.lang.api import (
    SglFunction,
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    global_config,
    select,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
)
from sglrs.lang.chat_template import ChatTemplate, get_chat_template, register_chat_template
from sglrs.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from sglrs.lang.interpreter import ProgramError, ProgramState, ProgramStateGroup

__all__ = [
    "BackendError",
    "Engine",
    "BaseBackend",
    "ChatTemplate",
    "ProgramError",
    "ProgramState",
    "ProgramStateGroup",
    "RuntimeEndpoint",
    "SglFunction",
    "__version__",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_chat_template",
    "get_server_info",
    "global_config",
    "greedy_token_selection",
    "register_chat_template",
    "select",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
    "user",
    "user_begin",
    "user_end",
]
