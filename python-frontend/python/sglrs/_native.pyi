"""The compiled part of sglrs (PyO3): the runtime inside this process."""

from typing import Iterator, List, Optional

__version__: str

class Engine:
    """The sglrs runtime (model, scheduler thread, radix cache, grammars) in this process.

    `config` is a JSON object of `sglrs serve` options by their long names with underscores
    (`page_size`, `kv_memory_mb`, `schedule_policy`, `chunked_prefill_size`,
    `max_batch_tokens`, `max_running_requests`, `threads`, `context_length`,
    `disable_jump_forward`, `served_model_name`, `quantize`); unknown names raise `ValueError`.
    Every call releases the GIL while it waits.
    """

    def __init__(self, model_path: Optional[str] = None, config: str = "{}") -> None: ...
    def generate(self, body: str) -> str:
        """Answer one SGLang-native `/generate` body (JSON text) with the response JSON text.

        A plain generation goes straight to the scheduler thread (validated, tokenized and
        answered as the route does); anything else goes through the server's router.

        Raises `ValueError` for a request the server would answer with HTTP 4xx, and
        `RuntimeError` for a failure of the runtime.
        """
    def submit_group(self, bodies: List[str]) -> List[PendingGenerate]:
        """Submit several `/generate` bodies at once; one handle per body, in order.

        Plain generations (one prompt, `sampling_params`, `priority`, `extra_key`) reach the
        scheduler in one message and are admitted in the same step; other bodies go through
        the server's router. A body that fails validation gives a handle whose `wait()`
        raises its error.
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

class PendingGenerate:
    """A submitted `/generate`."""

    def wait(self) -> str:
        """Wait (GIL released) for the response JSON text; raises `ValueError` (HTTP 4xx)
        or `RuntimeError`; a second call raises `RuntimeError`."""

class GenerateStream(Iterator[str]):
    """The events of a streaming `/generate`, as JSON text."""

    def __iter__(self) -> GenerateStream: ...
    def __next__(self) -> str: ...
