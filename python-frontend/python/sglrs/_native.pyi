"""The compiled part of sglrs (PyO3): the runtime inside this process."""

from typing import Iterator, Optional

__version__: str

class Engine:
    """The sglrs runtime (model, scheduler thread, radix cache, grammars) in this process.

    `config` is a JSON object of `sglrs serve` options by their long names with underscores
    (`page_size`, `kv_memory_mb`, `schedule_policy`, `chunked_prefill_size`,
    `max_batch_tokens`, `max_running_requests`, `threads`, `context_length`,
    `disable_jump_forward`, `served_model_name`); unknown names raise `ValueError`.
    Every call releases the GIL while it waits.
    """

    def __init__(self, model_path: Optional[str] = None, config: str = "{}") -> None: ...
    def generate(self, body: str) -> str:
        """Answer one SGLang-native `/generate` body (JSON text) with the response JSON text.

        Raises `ValueError` for a request the server would answer with HTTP 4xx, and
        `RuntimeError` for a failure of the runtime.
        """
    def generate_stream(self, body: str) -> GenerateStream:
        """Start a streaming `/generate`; iterate for each event's JSON text."""
    def render_chat(self, messages: str) -> Optional[str]:
        """Render a JSON list of messages with the model's chat template (no generation
        prompt); `None` when the model has no template."""
    def model_path(self) -> str: ...
    def server_info(self) -> str:
        """`/get_server_info` as JSON text."""
    def flush_cache(self) -> bool:
        """Empty the prefix cache; `False` while requests are running."""
    def shutdown(self) -> None:
        """Stop the engine; later calls raise `RuntimeError`."""

class GenerateStream(Iterator[str]):
    """The events of a streaming `/generate`, as JSON text."""

    def __iter__(self) -> GenerateStream: ...
    def __next__(self) -> str: ...
