"""The interpreter: a program state, the executor behind it, fork/join, and batch runs.

Each `ProgramState` owns a `StreamExecutor` with its own worker thread. ``s += expr`` queues
the expression and returns at once; reading a variable (``s["answer"]``), the text or the
messages waits for the work it depends on. Forked states have their own workers, so the
branches of a fork generate concurrently, and the backend sees their requests together.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Optional,
    Sequence,
    Union,
)

from sglrs.lang.chat_template import ChatTemplate
from sglrs.lang.ir import (
    SamplingParams,
    SglCommitLazy,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    SglVariable,
    SglVarScopeBegin,
    SglVarScopeEnd,
)

if TYPE_CHECKING:
    from sglrs.backend.base import BaseBackend
    from sglrs.lang.api import SglFunction

AppendValue = Union[SglExpr, str]


class ProgramError(RuntimeError):
    """A program's generation failed; `__cause__` holds the backend's error."""


class StreamExecutor:
    """Runs one program state's expressions, in order, on a worker thread."""

    def __init__(
        self,
        backend: "BaseBackend",
        arguments: Dict[str, Any],
        default_sampling_params: SamplingParams,
        chat_template: Optional[ChatTemplate],
        stream: bool,
        use_thread: bool = True,
    ) -> None:
        self.sid = uuid.uuid4().hex
        self.backend = backend
        self.arguments = arguments
        self.default_sampling_params = default_sampling_params
        self.stream = stream

        self.variables: Dict[Optional[str], Any] = {}
        self.variable_event: Dict[Optional[str], threading.Event] = {}
        self.meta_info: Dict[Optional[str], Any] = {}
        self.is_finished = False
        self.error_: Optional[BaseException] = None

        self.text_ = ""
        self.messages_: List[Dict[str, Any]] = []
        self.chat_template = chat_template or backend.get_chat_template()
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos: Optional[int] = None
        self.fork_start_text_pos: Optional[int] = None
        # The backend's token linking this state to siblings started with it (`open_group`);
        # the backend consumes it with the state's first request.
        self.submit_group: Optional[Any] = None

        # Streaming readers wait on this condition for new text or the end.
        self._changed = threading.Condition()
        self._streaming_vars: Dict[Optional[str], bool] = {}
        self._ended = False

        self.use_thread = use_thread
        self._queue: "queue.Queue[Optional[SglExpr]]" = queue.Queue()
        self._worker: Optional[threading.Thread] = None
        if use_thread:
            self._worker = threading.Thread(
                target=self._worker_loop, name=f"sglrs-state-{self.sid[:8]}", daemon=True
            )
            self._worker.start()

    # -- submission and waiting ------------------------------------------------------------

    def submit(self, expr: SglExpr) -> None:
        """Queue `expr` (runs it at once when the executor has no thread)."""
        self._init_var_events(expr)
        if self.use_thread:
            self._queue.put(expr)
        else:
            self._run_guarded(expr)

    def sync(self) -> None:
        """Wait until every queued expression has run."""
        if self.use_thread:
            self._queue.join()

    def end(self) -> None:
        """Stop the worker once the queue drains; the backend may release per-state data."""
        if self._ended:
            return
        self._ended = True
        if self.use_thread and self._worker is not None and self._worker.is_alive():
            self._queue.put(None)  # the worker tells the backend once the queue drained
        else:
            self._mark_finished()
            self.backend.end_program(self)

    def get_var(self, name: Optional[str]) -> Any:
        """The value of variable `name`, waiting for it to be produced."""
        event = self.variable_event.get(name)
        if event is not None:
            event.wait()
        if name not in self.variables:
            if self.error_ is not None:
                raise ProgramError(f"variable {name!r} was not produced: {self.error_}") from (
                    self.error_
                )
            raise KeyError(name)
        return self.variables[name]

    def set_var(self, name: Optional[str], value: Any) -> None:
        """Set variable `name` directly."""
        self.variables[name] = value

    def get_meta_info(self, name: Optional[str], timeout: Optional[float] = None) -> Any:
        """The backend's `meta_info` for the `gen`/`select` named `name`."""
        event = self.variable_event.get(name)
        if event is not None and not event.wait(timeout):
            raise TimeoutError(f"timed out waiting for {name!r}")
        return self.meta_info.get(name)

    def text(self) -> str:
        """The whole text so far (waits for queued work)."""
        self.sync()
        return self.text_

    def messages(self) -> List[Dict[str, Any]]:
        """The chat messages so far in OpenAI format (waits for queued work)."""
        self.sync()
        return self.messages_

    def error(self) -> Optional[BaseException]:
        """The error that stopped this state, if any (waits for queued work)."""
        self.sync()
        return self.error_

    def fork(self, size: int = 1) -> List["StreamExecutor"]:
        """`size` new executors starting from this state's text, messages and variables."""
        size = int(size)
        if size < 1:
            raise ValueError("fork size must be at least 1")
        self.sync()
        if size > 1 and self.text_ and self.error_ is None:
            # Compute the shared prefix once, before the branches ask for it.
            self.submit(SglCommitLazy())
            self.sync()
        if self.error_ is not None:
            raise ProgramError(f"cannot fork a failed state: {self.error_}") from self.error_
        children = []
        for _ in range(size):
            child = StreamExecutor(
                self.backend,
                self.arguments,
                self.default_sampling_params,
                self.chat_template,
                self.stream,
                self.use_thread,
            )
            child.variables = dict(self.variables)
            child.text_ = self.text_
            child.messages_ = list(self.messages_)
            child.cur_role = self.cur_role
            child.cur_role_begin_pos = self.cur_role_begin_pos
            child.fork_start_text_pos = len(self.text_)
            children.append(child)
        group = self.backend.open_group(size) if size > 1 else None
        for child in children:
            child.submit_group = group
        return children

    # -- streaming ---------------------------------------------------------------------------

    def iter_text(self) -> Iterator[str]:
        """Yield new text as it is appended, until the program ends."""
        prev = 0
        while True:
            with self._changed:
                while len(self.text_) <= prev and not self.is_finished:
                    self._changed.wait()
                chunk = self.text_[prev:]
                done = self.is_finished
            prev += len(chunk)
            if chunk:
                yield chunk
            if done and prev >= len(self.text_):
                return

    def iter_var(self, name: str) -> Iterator[str]:
        """Yield new text of variable `name` as it is generated, until it is complete."""
        prev = 0
        while True:
            with self._changed:
                while True:
                    event = self.variable_event.get(name)
                    value = self.variables.get(name)
                    done = (event is not None and event.is_set()) or self.is_finished
                    if isinstance(value, str) and len(value) > prev:
                        break
                    if done:
                        break
                    self._changed.wait()
            chunk = value[prev:] if isinstance(value, str) else ""
            prev += len(chunk)
            if chunk:
                yield chunk
            if done and not (isinstance(value, str) and len(value) > prev):
                final = self.variables.get(name)
                if isinstance(final, str) and len(final) > prev:
                    yield final[prev:]
                return

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _mark_finished(self) -> None:
        with self._changed:
            self.is_finished = True
            self._changed.notify_all()

    # -- the worker ---------------------------------------------------------------------------

    def _worker_loop(self) -> None:
        while True:
            expr = self._queue.get()
            if expr is None:
                self._queue.task_done()
                break
            self._run_guarded(expr)
            self._queue.task_done()
        self._mark_finished()
        self.backend.end_program(self)

    def _run_guarded(self, expr: SglExpr) -> None:
        if self.error_ is not None:
            # A failed state runs nothing more; waiters were released when it failed.
            self._init_var_events(expr, release=True)
            return
        try:
            self._execute(expr)
        except Exception as e:  # noqa: BLE001 - reported through error() and get_var
            warnings.warn(f"sglrs program state failed: {e!r}", RuntimeWarning, stacklevel=1)
            self.error_ = e
            for event in self.variable_event.values():
                event.set()
        self._notify()

    def _init_var_events(self, expr: SglExpr, release: bool = False) -> None:
        if isinstance(expr, (SglGen, SglSelect, SglVarScopeBegin)):
            event = self.variable_event.get(expr.name)
            if event is None or event.is_set():
                event = threading.Event()
                self.variable_event[expr.name] = event
            if release:
                event.set()
        elif isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._init_var_events(e, release)

    def _execute(self, expr: Union[SglExpr, str]) -> None:
        if isinstance(expr, str):
            expr = SglConstantText(expr)
        if isinstance(expr, SglConstantText):
            self._fill(expr.value)
        elif isinstance(expr, SglGen):
            self._execute_gen(expr)
        elif isinstance(expr, SglSelect):
            self._execute_select(expr)
        elif isinstance(expr, SglExprList):
            for e in expr.expr_list:
                self._execute(e)
        elif isinstance(expr, SglRoleBegin):
            self._execute_role_begin(expr)
        elif isinstance(expr, SglRoleEnd):
            self._execute_role_end(expr)
        elif isinstance(expr, SglVariable):
            self._fill(str(expr.source.stream_executor.get_var(expr.name)))
        elif isinstance(expr, SglVarScopeBegin):
            self.variables[expr.name] = len(self.text_)
        elif isinstance(expr, SglVarScopeEnd):
            start = self.variables[expr.name]
            self.variables[expr.name] = self.text_[int(start) :]
            self.variable_event[expr.name].set()
        elif isinstance(expr, SglCommitLazy):
            self.backend.commit_lazy_operations(self)
        else:
            raise TypeError(f"unknown expression {expr!r}")

    def _fill(self, value: str) -> None:
        with self._changed:
            self.text_ += str(value)
            self._changed.notify_all()

    def resolve_sampling_params(self, params: SamplingParams) -> SamplingParams:
        """Program defaults overridden by `params`, plus the chat template's stop strings."""
        out = self.default_sampling_params.merged(params)
        if self.chat_template.stop_str:
            stop = out.stop_list()
            for s in self.chat_template.stop_str:
                if s not in stop:
                    stop.append(s)
            out.stop = stop
        return out

    def _execute_gen(self, expr: SglGen) -> None:
        params = self.resolve_sampling_params(expr.sampling_params)
        name = expr.name
        if not self.stream:
            comp, meta = self.backend.generate(self, params)
            self._fill(comp)
            self.variables[name] = comp
            self.meta_info[name] = meta
            self.variable_event[name].set()
            return
        with self._changed:
            self.variables[name] = ""
            self._streaming_vars[name] = True
        try:
            for chunk, meta in self.backend.generate_stream(self, params):
                with self._changed:
                    self.text_ += chunk
                    self.variables[name] = str(self.variables[name]) + chunk
                    self.meta_info[name] = meta
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._streaming_vars.pop(name, None)
                self.variable_event[name].set()
                self._changed.notify_all()

    def _execute_select(self, expr: SglSelect) -> None:
        decision = self.backend.select(self, expr.choices, expr.temperature, expr.choices_method)
        if expr.name is not None:
            self.variables[expr.name] = decision.decision
            self.meta_info[expr.name] = decision.meta_info
            self.variable_event[expr.name].set()
        self._fill(decision.decision)

    def _execute_role_begin(self, expr: SglRoleBegin) -> None:
        if self.cur_role is not None:
            raise ValueError(
                f"cannot open a {expr.role!r} message inside an open {self.cur_role!r} message"
            )
        if not self.messages_ and expr.role != "system":
            default_system = self.chat_template.default_system_prompt
            if default_system:
                self._execute_role_begin(SglRoleBegin("system"))
                self._fill(default_system)
                self._execute_role_end(SglRoleEnd("system"))
        self.cur_role = expr.role
        prefix, _ = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._fill(prefix)
        self.cur_role_begin_pos = len(self.text_)

    def _execute_role_end(self, expr: SglRoleEnd) -> None:
        if self.cur_role != expr.role or self.cur_role_begin_pos is None:
            raise ValueError(
                f"cannot close a {expr.role!r} message: the open message is {self.cur_role!r}"
            )
        content = self.text_[self.cur_role_begin_pos :].lstrip()
        _, suffix = self.chat_template.get_prefix_and_suffix(expr.role, self.messages_)
        self._fill(suffix)
        self.messages_.append({"role": expr.role, "content": content})
        self.cur_role = None
        self.cur_role_begin_pos = None


class ProgramState:
    """The state a program writes to: ``s += ...``, ``s["name"]``, ``s.text()``, ``s.fork(n)``."""

    def __init__(self, stream_executor: StreamExecutor) -> None:
        self.stream_executor = stream_executor
        #: What the program function returned.
        self.ret_value: Any = None

    def _role(
        self, name: str, expr: Optional[AppendValue]
    ) -> Union[SglExprList, "contextlib.AbstractContextManager[None]"]:
        if expr is not None:
            body = expr if isinstance(expr, SglExpr) else SglConstantText(str(expr))
            role_expr = SglExprList([SglRoleBegin(name), body, SglRoleEnd(name)])
            self.stream_executor.submit(role_expr)
            return role_expr

        @contextlib.contextmanager
        def scope() -> Iterator[None]:
            self.stream_executor.submit(SglRoleBegin(name))
            yield
            self.stream_executor.submit(SglRoleEnd(name))

        return scope()

    def system(self, expr: Optional[AppendValue] = None) -> Any:
        """Append a system message, or ``with s.system(): ...`` to write one piece by piece."""
        return self._role("system", expr)

    def user(self, expr: Optional[AppendValue] = None) -> Any:
        """Append a user message, or open one as a context manager."""
        return self._role("user", expr)

    def assistant(self, expr: Optional[AppendValue] = None) -> Any:
        """Append an assistant message, or open one as a context manager."""
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str) -> Iterator[None]:
        """Capture everything appended inside the block into variable `name`."""
        self.stream_executor.submit(SglVarScopeBegin(name))
        yield
        self.stream_executor.submit(SglVarScopeEnd(name))

    def fork(self, size: int = 1) -> "ProgramStateGroup":
        """Split into `size` branches that share everything so far (computed once)."""
        children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextlib.contextmanager
    def copy(self) -> Iterator["ProgramState"]:
        """A single branch whose new variables are joined back at the end of the block."""
        group = self.fork(1)
        try:
            yield group[0]
        finally:
            group.join()

    def text(self) -> str:
        """The whole prompt and output so far."""
        return self.stream_executor.text()

    def messages(self) -> List[Dict[str, Any]]:
        """The chat messages so far, OpenAI style (``{"role", "content"}``)."""
        return self.stream_executor.messages()

    def sync(self) -> None:
        """Wait for every queued expression."""
        self.stream_executor.sync()

    def error(self) -> Optional[BaseException]:
        """The error that stopped the program, or `None`."""
        return self.stream_executor.error()

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Yield the text (or one variable) as it is generated; needs ``run(stream=True)``.

        Without streaming, yields the finished text (or variable) once.
        """
        ex = self.stream_executor
        if not ex.stream:
            yield self.text() if var_name is None else str(self.get_var(var_name))
            return
        if var_name is None:
            yield from ex.iter_text()
        else:
            yield from ex.iter_var(var_name)

    def get_var(self, name: Optional[str]) -> Any:
        """The value of a variable, waiting for it."""
        return self.stream_executor.get_var(name)

    def set_var(self, name: Optional[str], value: Any) -> None:
        """Set a variable."""
        self.stream_executor.set_var(name, value)

    def get_meta_info(self, name: Optional[str]) -> Any:
        """The backend's `meta_info` (token counts, `cached_tokens`, logprobs) for `name`."""
        return self.stream_executor.get_meta_info(name)

    def __iadd__(self, other: AppendValue) -> "ProgramState":
        if other is None:
            raise ValueError("cannot append None to a program state")
        if isinstance(other, str):
            other = SglConstantText(other)
        if not isinstance(other, SglExpr):
            raise TypeError(f"cannot append {type(other).__name__} to a program state")
        self.stream_executor.submit(other)
        return self

    def __getitem__(self, name: str) -> Any:
        return self.get_var(name)

    def __setitem__(self, name: str, value: Any) -> None:
        self.set_var(name, value)

    def __contains__(self, name: str) -> bool:
        return name in self.stream_executor.variables

    def __del__(self) -> None:
        try:
            self.stream_executor.end()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The branches of a fork; ``join()`` gathers their new variables into the parent."""

    def __init__(self, states: List[ProgramState], src_state: ProgramState) -> None:
        self.states = states
        self.src_state = src_state

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch and copy each new variable back as a list (one per branch)."""
        if mode != "gather_variable":
            raise ValueError(f"unsupported join mode {mode!r} (only 'gather_variable')")
        src_vars = self.src_state.stream_executor.variables
        known = set(src_vars.keys())
        for child in self.states:
            child.stream_executor.sync()
            for k, v in child.stream_executor.variables.items():
                if k in known:
                    continue
                src_vars.setdefault(k, []).append(v)
        for child in self.states:
            child.stream_executor.end()

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self) -> Iterator[ProgramState]:
        return iter(self.states)

    def __iadd__(
        self, other: Union[AppendValue, Callable[[int], AppendValue], Sequence[AppendValue]]
    ) -> "ProgramStateGroup":
        if isinstance(other, (SglExpr, str)):
            for st in self.states:
                st += other
        elif callable(other):
            for i, st in enumerate(self.states):
                st += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} values for {len(self.states)} branches")
            for st, v in zip(self.states, other):
                st += v
        else:
            raise TypeError(f"cannot append {type(other).__name__} to forked states")
        return self


def _run_internal(
    state: ProgramState,
    program: "SglFunction",
    args: Sequence[Any],
    kwargs: Dict[str, Any],
    sync: bool,
) -> None:
    try:
        state.ret_value = program.func(state, *args, **kwargs)
    finally:
        state.stream_executor.end()
    if sync:
        state.stream_executor.sync()


def run_program(
    program: "SglFunction",
    backend: "BaseBackend",
    args: Sequence[Any],
    kwargs: Dict[str, Any],
    default_sampling_params: SamplingParams,
    stream: bool,
    sync: bool = False,
    submit_group: Optional[Any] = None,
) -> ProgramState:
    """Run one program; with `stream`, the function itself runs on a thread. `submit_group`
    is the backend's token linking this program to others started with it."""
    kwargs = {**kwargs, **program.bind_arguments}
    executor = StreamExecutor(backend, kwargs, default_sampling_params, None, stream)
    executor.submit_group = submit_group
    state = ProgramState(executor)
    if stream:
        t = threading.Thread(
            target=_run_internal, args=(state, program, args, kwargs, sync), daemon=True
        )
        t.start()
    else:
        _run_internal(state, program, args, kwargs, sync)
    return state


def run_program_batch(
    program: "SglFunction",
    backend: "BaseBackend",
    batch_kwargs: Sequence[Dict[str, Any]],
    default_sampling_params: SamplingParams,
    num_threads: Union[str, int],
    progress_bar: bool,
) -> List[ProgramState]:
    """Run a program once per argument dict on a thread pool; results in input order."""
    if not batch_kwargs:
        return []
    if num_threads == "auto":
        import os

        n = max(96, (os.cpu_count() or 1) * 16)
    elif isinstance(num_threads, int) and num_threads >= 1:
        n = num_threads
    else:
        raise ValueError("num_threads must be 'auto' or a positive integer")
    n = min(n, len(batch_kwargs))

    pbar: Any = None
    if progress_bar:
        import tqdm

        pbar = tqdm.tqdm(total=len(batch_kwargs))

    # The programs the pool starts at once may hand their first requests to the backend as
    # one group (one scheduler step in-process); later ones arrive as the programs get there.
    first_wave = backend.open_group(n) if n > 1 else None
    started = [0]
    started_lock = threading.Lock()

    def group_for_next() -> Optional[Any]:
        with started_lock:
            started[0] += 1
            return first_wave if started[0] <= n else None

    def one(kw: Dict[str, Any]) -> ProgramState:
        st = run_program(
            program, backend, (), kw, default_sampling_params, False, sync=True,
            submit_group=group_for_next(),
        )
        if pbar is not None:
            pbar.update()
        return st

    try:
        if n == 1:
            return [one(kw) for kw in batch_kwargs]
        with ThreadPoolExecutor(n) as pool:
            futures = [pool.submit(one, kw) for kw in batch_kwargs]
            return [f.result() for f in futures]
    finally:
        if pbar is not None:
            pbar.close()
