"""Prefill/decode disaggregation behind SGLang's own router (`sglang-router==0.3.2`, PD mode).

A prefill server and a decode server (`--disaggregation-mode prefill|decode`, one cluster
identity) run behind `python -m sglang_router.launch_router --pd-disaggregation`. As root
(CI is), each server runs in its own network namespace: the router reaches both over one
veth pair each, and the KV pages travel over a third veth pair between the two namespaces,
where the loss test drops datagrams with nftables. Without root everything runs on loopback
(the loss test is skipped, saying why).

Checked: the router's answers equal a unified server's (tokens, text, logprobs as the
engine's f32 values) for plain, streamed, logprob and chat requests; a follow-up turn moves
only its new pages; bootstrap fields a server cannot honour are refused by name; a decode
server killed with its room open, a prefill server killed mid-request, datagram loss and a
host with another identity each end as the issue asks, with no page, room or lock left held.

Run:  pip install sglang-router==0.3.2 openai pytest
      SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_pd.py
"""

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import openai
import pytest

from test_reliability import ROOT, Server

pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router==0.3.2)")

BINARY = os.environ.get("SGLRS_BIN") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "sglrs"
)


_GIVEN: set[int] = set()


def _fresh(kind: int) -> int:
    """A free loopback port this process was not given before (the OS may hand a
    just-released port out again: two servers on one port do not both start)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise RuntimeError("no port not given before in 100 tries")


def free_port() -> int:
    return _fresh(socket.SOCK_STREAM)


def free_udp_port() -> int:
    return _fresh(socket.SOCK_DGRAM)


def sh(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)


class Namespaces:
    """Network namespaces and links a test made (`created`), removed by `close`."""

    created: list

    def prefix(self, ns):
        return ["ip", "netns", "exec", ns] if ns else []

    def close(self):
        for c in reversed(self.created):
            if isinstance(c, tuple):
                sh("ip", "link", "del", c[1], check=False)
            else:
                sh("ip", "netns", "del", c, check=False)
        self.created = []


class Network(Namespaces):
    """Where the two servers live. As root: namespaces `P` (prefill) and `D` (decode), each
    joined to the root namespace by a veth pair (the router's HTTP), and to each other by a
    third (the KV transfer; `D` routes the prefill's address over it). Otherwise loopback."""

    made = 0

    def __init__(self, kv_mtu=None):
        self.netns = os.geteuid() == 0 and shutil.which("ip") is not None
        Network.made += 1
        self.created = []
        if not self.netns:
            self.p_host = self.d_host = "127.0.0.1"
            self.p_ns = self.d_ns = None
            return
        tag = f"{os.getpid() % 10000}{chr(96 + Network.made % 26)}"
        net = 100 + (os.getpid() + Network.made) % 100
        self.p_ns, self.d_ns = f"sglrs-p{tag}", f"sglrs-d{tag}"
        self.kv_dev = f"kvd{tag}"  # the decode side of the KV link, in D
        try:
            self._make(tag, net, kv_mtu)
        except subprocess.CalledProcessError as e:
            # A container without the rights for namespaces or veths: loopback it is.
            self.close()
            print(f"test_pd: network namespaces unavailable ({e.stderr.strip()}); using loopback",
                  file=sys.stderr)
            self.netns = False
            self.p_host = self.d_host = "127.0.0.1"
            self.p_ns = self.d_ns = None

    def _make(self, tag, net, kv_mtu):
        """Namespaces, veths, addresses and the route; raises if the system refuses one."""
        for ns in (self.p_ns, self.d_ns):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        links = [
            (f"rp{tag}", None, f"10.{net}.1.1/24", f"pr{tag}", self.p_ns, f"10.{net}.1.2/24"),
            (f"rd{tag}", None, f"10.{net}.2.1/24", f"dr{tag}", self.d_ns, f"10.{net}.2.2/24"),
            (f"kvp{tag}", self.p_ns, f"10.{net}.3.1/24", self.kv_dev, self.d_ns, f"10.{net}.3.2/24"),
        ]
        for a, a_ns, a_ip, b, b_ns, b_ip in links:
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            self.created.append(("link", a))  # gone with its namespace, if it moves into one
            for dev, ns, ip in ((a, a_ns, a_ip), (b, b_ns, b_ip)):
                if ns:
                    sh("ip", "link", "set", dev, "netns", ns)
                pre = ["ip", "-n", ns] if ns else ["ip"]
                sh(*pre, "addr", "add", ip, "dev", dev)
                sh(*pre, "link", "set", dev, "up")
        if kv_mtu:
            sh("ip", "-n", self.p_ns, "link", "set", f"kvp{tag}", "mtu", str(kv_mtu))
            sh("ip", "-n", self.d_ns, "link", "set", self.kv_dev, "mtu", str(kv_mtu))
        self.p_host, self.d_host = f"10.{net}.1.2", f"10.{net}.2.2"
        # KV datagrams from D to the prefill's address take the P-D link.
        sh("ip", "-n", self.d_ns, "route", "add", f"{self.p_host}/32", "via", f"10.{net}.3.1")


class Proc(Server):
    """`sglrs serve` in a namespace (or on loopback), stopped on exit."""

    def __init__(self, net, ns, host, *flags, port=None):
        self.port = port or free_port()
        self.args = [*net.prefix(ns), BINARY, "serve", "--host", host, "--port", str(self.port),
                     "--threads", "1", *flags]
        self.base = f"http://{host}:{self.port}"
        self.start()

    def start(self):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.wait_until_up("sglrs serve", 300)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


class Router(Server):
    def __init__(self, prefill, bootstrap_port, decode):
        port, metrics = free_port(), free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-port", str(metrics), "--pd-disaggregation",
             "--prefill", prefill.base, str(bootstrap_port), "--decode", decode.base],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.base = f"http://127.0.0.1:{port}"
        self.wait_until_up("sglang-router", 120)


class Cluster:
    """A prefill and a decode server behind the router (torn down by `close`)."""

    def __init__(self, identity, decode_identity=None, timeout="10", kv_mtu=None):
        self.net = Network(kv_mtu)
        self.boot = free_udp_port()
        self.identity = identity
        try:
            self.prefill = Proc(self.net, self.net.p_ns, self.net.p_host,
                                "--disaggregation-mode", "prefill", "--cluster-identity", identity,
                                "--disaggregation-bootstrap-port", str(self.boot),
                                "--disaggregation-timeout", timeout)
            self.decode = Proc(self.net, self.net.d_ns, self.net.d_host,
                               "--disaggregation-mode", "decode",
                               "--cluster-identity", decode_identity or identity,
                               "--disaggregation-timeout", timeout)
            self.router = Router(self.prefill, self.boot, self.decode)
        except Exception:
            self.close()
            raise

    def close(self):
        for name in ("router", "decode", "prefill"):
            p = getattr(self, name, None)
            if p is not None:
                p.stop()
        self.net.close()

    def assert_idle(self):
        """Zero pages, rooms and locks held on both servers (waits a little for
        acknowledgements still in flight)."""
        deadline = time.time() + 15
        while True:
            states = [info(s.base) for s in (self.prefill, self.decode)]
            held = [(s["cache"]["running_pages"], s["cache"]["held_locks"],
                     s["disaggregation"]["rooms_open"], s["disaggregation"]["held_pages"],
                     s["disaggregation"]["awaiting_import"], s["num_running_reqs"],
                     s["num_waiting_reqs"]) for s in states]
            if all(h == (0, 0, 0, 0, 0, 0, 0) for h in held):
                return states
            if time.time() > deadline:
                raise AssertionError(f"still held (pages, locks, rooms, held pages, imports, running, waiting): {held}")
            time.sleep(0.3)


def info(base):
    with urllib.request.urlopen(base + "/get_server_info", timeout=30) as r:
        return json.loads(r.read())["internal_states"][0]


def post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")


def served_again(base, text, within):
    """Retries a 4-token greedy `/generate` of `text` each second until it answers 200
    (at most `within` seconds); returns the answer."""
    deadline = time.time() + within
    while True:
        status, ok = post(base, "/generate",
                          {"text": text, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        if status == 200:
            return ok
        assert time.time() < deadline, (status, ok)
        time.sleep(1)


def stream(base, body):
    """The chunks of a streamed `/generate` (parsed JSON), up to `[DONE]`."""
    req = urllib.request.Request(base + "/generate", data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunks.append(json.loads(data))
    return chunks


def f32(v):
    """Floats as the engine's f32 values (the router re-serializes merged answers with an
    f64 parser that is not correctly rounded, so the decimal text may differ in the last
    f64 digits; the f32 value may not)."""
    if isinstance(v, float):
        return struct.unpack("f", struct.pack("f", v))[0]
    if isinstance(v, (list, tuple)):
        return [f32(x) for x in v]
    if isinstance(v, dict):
        return {k: f32(x) for k, x in v.items()}
    return v


LOGPROB_KEYS = ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs",
                "output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs")

TOPICS = ["the sea", "a lighthouse", "mountains", "a library", "rain", "a train station", "bees",
          "the moon", "a bakery", "winter", "a river", "chess", "a garden", "the desert",
          "an old clock", "a market"]
PROMPTS = [f"Write two sentences about {t}." for t in TOPICS]


@pytest.fixture(scope="module")
def identity():
    d = tempfile.mkdtemp(prefix="sglrs-id-")
    subprocess.run([BINARY, "cluster-identity", "--out", d], check=True, capture_output=True)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(identity):
    c = Cluster(identity)
    yield c
    c.close()


@pytest.fixture(scope="module")
def unified():
    with Server("--threads", "1") as s:
        yield s


def both(fn, items):
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return list(pool.map(fn, items))


def test_router_answers_equal_unified_mode(cluster, unified):
    gen = lambda p: {"text": p, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
    # Plain.
    for p, (rs, routed), (us, direct) in zip(
        PROMPTS, both(lambda p: post(cluster.router.base, "/generate", gen(p)), PROMPTS),
        both(lambda p: post(unified.base, "/generate", gen(p)), PROMPTS),
    ):
        assert rs == 200 and us == 200, (routed, direct)
        assert routed["output_ids"] == direct["output_ids"], p
        assert routed["text"] == direct["text"]
        assert routed["meta_info"]["disaggregation"]["role"] == "decode"
    # Seeded sampling (the decode host continues the prefill's random stream), penalties,
    # stop strings and grammars (the decode host's matcher takes the prefill's first token).
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                         "required": ["name", "age"]})
    varied = [
        {"temperature": 0.8, "sampling_seed": 7, "max_new_tokens": 16},
        {"temperature": 0.9, "top_p": 0.9, "sampling_seed": 42, "frequency_penalty": 0.5, "max_new_tokens": 12},
        {"temperature": 1.0, "sampling_seed": 3, "stop": ["."], "max_new_tokens": 24},
        {"temperature": 0, "json_schema": schema, "max_new_tokens": 40},
        {"temperature": 0, "regex": "(red|green|blue)", "max_new_tokens": 8},
    ]
    for sp in varied:
        body = {"text": "Give me a person as JSON, a colour, or a story:", "sampling_params": sp}
        (rs, routed), (us, direct) = post(cluster.router.base, "/generate", body), post(unified.base, "/generate", body)
        assert rs == 200 and us == 200, (routed, direct)
        assert routed["output_ids"] == direct["output_ids"], sp
    # Streamed: the chunks carry the same growing text and ids.
    for p, r, d in zip(PROMPTS, both(lambda p: stream(cluster.router.base, gen(p)), PROMPTS),
                       both(lambda p: stream(unified.base, gen(p)), PROMPTS)):
        assert [c["text"] for c in r] == [c["text"] for c in d], p
        assert r[-1]["output_ids"] == d[-1]["output_ids"]
    # Logprobs: the router puts the prefill's input logprobs in front of the decode's.
    lp = lambda p: {**gen(p), "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0,
                    "return_text_in_logprobs": True}
    for p, (rs, routed), (us, direct) in zip(
        PROMPTS, both(lambda p: post(cluster.router.base, "/generate", lp(p)), PROMPTS),
        both(lambda p: post(unified.base, "/generate", lp(p)), PROMPTS),
    ):
        assert rs == 200 and us == 200
        assert routed["output_ids"] == direct["output_ids"], p
        for k in LOGPROB_KEYS:
            assert f32(routed["meta_info"][k]) == f32(direct["meta_info"][k]), (p, k)
        assert len(routed["meta_info"]["input_token_logprobs"]) == routed["meta_info"]["prompt_tokens"]
    # Streamed logprobs.
    for p in PROMPTS[:4]:
        r, d = stream(cluster.router.base, lp(p)), stream(unified.base, lp(p))
        for k in LOGPROB_KEYS:
            assert f32(r[-1]["meta_info"][k]) == f32(d[-1]["meta_info"][k]), (p, k)
    # OpenAI chat, with logprobs, through the official client.
    via = openai.OpenAI(base_url=cluster.router.base + "/v1", api_key="none", max_retries=0)
    ref = unified.client(max_retries=0)

    def chat(c, p):
        r = c.chat.completions.create(model="default", messages=[{"role": "user", "content": p}],
                                      max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
        return r.choices[0].message.content, f32([(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                                                   for t in r.choices[0].logprobs.content])

    assert both(lambda p: chat(via, p), PROMPTS) == both(lambda p: chat(ref, p), PROMPTS)

    def completion(c, p, stream):
        kw = dict(model="default", prompt=p, max_tokens=12, temperature=0)
        if stream:
            return "".join(x.choices[0].text for x in c.completions.create(stream=True, **kw))
        return c.completions.create(**kw).choices[0].text

    for stream_it in (False, True):
        assert both(lambda p: completion(via, p, stream_it), PROMPTS[:8]) == \
            both(lambda p: completion(ref, p, stream_it), PROMPTS[:8])
    states = cluster.assert_idle()
    assert states[0]["disaggregation"]["transfers"] >= 5 * len(PROMPTS)
    assert states[1]["disaggregation"]["failures"] == {}


def test_a_follow_up_turn_moves_only_its_new_pages(cluster):
    doc = "".join(f"Record {i}: the value is {i * 37 % 101}. " for i in range(120))
    s1, t1 = post(cluster.router.base, "/generate",
                  {"text": doc + "Which record has value 5?", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert s1 == 200, t1
    d1 = t1["meta_info"]["disaggregation"]
    assert t1["meta_info"]["prompt_tokens"] > 1000
    s2, t2 = post(cluster.router.base, "/generate",
                  {"text": doc + "Which record has value 5?" + t1["text"] + " And value 7?",
                   "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    assert s2 == 200, t2
    d2 = t2["meta_info"]["disaggregation"]
    pages = -(-t2["meta_info"]["prompt_tokens"] // 16)
    assert d1["pages_received"] == -(-t1["meta_info"]["prompt_tokens"] // 16), d1
    # The shared part stayed on the decode host: only the pages past it moved.
    assert d2["pages_skipped"] >= (t1["meta_info"]["prompt_tokens"] // 16) - 1, d2
    assert d2["pages_received"] == pages - d2["pages_skipped"] and d2["pages_received"] <= 3, d2
    cluster.assert_idle()


def test_bootstrap_fields_a_server_cannot_honour_are_refused_by_name(cluster, unified):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}, "bootstrap_host": "127.0.0.1",
            "bootstrap_port": 1, "bootstrap_room": 5}
    status, err = post(unified.base, "/generate", body)
    assert status == 400 and "bootstrap_host" in json.dumps(err) and "disaggregation" in json.dumps(err)
    status, err = post(cluster.decode.base, "/generate",
                       {**body, "sampling_params": {"max_new_tokens": 2, "n": 2}})
    assert status == 400 and "n > 1" in json.dumps(err), err
    status, err = post(cluster.decode.base, "/generate", {**body, "bootstrap_room": -1})
    assert status == 400 and "bootstrap_room" in json.dumps(err), err
    for s in (cluster.prefill, cluster.decode):
        status, err = post(s.base, "/generate", {**body, "sampling_params": {"max_new_tokens": 0}})
        assert status == 400 and "max_new_tokens" in json.dumps(err), err
    # What the router polls answers on both roles.
    for s in (cluster.prefill, cluster.decode):
        for path in ("/health", "/health_generate", "/get_server_info", "/server_info",
                     "/get_model_info", "/model_info", "/get_load"):
            with urllib.request.urlopen(s.base + path, timeout=60) as r:
                assert r.status == 200, (s.base, path)
    with urllib.request.urlopen(cluster.decode.base + "/get_load", timeout=10) as r:
        assert json.loads(r.read())[0]["load"] == 0


LONG = "".join(f"Line {i}: a quiet sentence about nothing in particular. " for i in range(150))


def test_a_killed_decode_server_frees_the_room_and_its_restart_serves(identity):
    c = Cluster(identity, timeout="8")
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            t0 = time.time()
            f = pool.submit(post, c.router.base, "/generate",
                            {"text": LONG, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
            # The decode server registered the room as soon as it admitted the request; the
            # prefill is still computing the prompt when the decode server dies.
            time.sleep(0.4)
            c.decode.kill()
            status, _ = f.result(timeout=90)
            assert status >= 400
            assert time.time() - t0 < 60
        # The prefill server gives the room up within its timeouts and holds nothing.
        deadline = time.time() + 30
        while True:
            d = info(c.prefill.base)["disaggregation"]
            if d["rooms_open"] == 0 and d["held_pages"] == 0:
                break
            assert time.time() < deadline, d
            time.sleep(0.5)
        c.decode.start()
        ok = served_again(c.router.base, "Hello", within=90)
        assert len(ok["output_ids"]) == 4
        c.assert_idle()
    finally:
        c.close()


def test_a_killed_prefill_server_fails_the_request_with_a_clear_error(identity):
    c = Cluster(identity, timeout="8")
    try:
        body = {"text": LONG, "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                "bootstrap_host": c.net.p_host, "bootstrap_port": c.boot, "bootstrap_room": 77}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            t0 = time.time()
            pf = pool.submit(post, c.prefill.base, "/generate", body)
            df = pool.submit(post, c.decode.base, "/generate", body)
            time.sleep(0.4)
            c.prefill.kill()
            status, err = df.result(timeout=60)
            waited = time.time() - t0
            with pytest.raises(Exception):
                pf.result(timeout=60)
        assert status >= 400 or err.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort", err
        text = json.dumps(err)
        assert "KV transfer failed" in text and "prefill host" in text, text
        assert waited < 30, waited
        d = info(c.decode.base)
        assert d["cache"]["running_pages"] == 0 and d["cache"]["held_locks"] == 0, d
        assert d["disaggregation"]["rooms_open"] == 0 and d["disaggregation"]["awaiting_import"] == 0, d
    finally:
        c.close()


def test_a_stopped_prefill_server_fails_the_transfer_in_time_and_serves_once_resumed(identity):
    """SIGSTOP the prefill server while a request's KV is on its way: the decode host gives
    the room up within --disaggregation-timeout with a clear error and holds nothing;
    after SIGCONT the prefill server lets its side go and both serve again."""
    c = Cluster(identity, timeout="5")
    try:
        body = {"text": LONG, "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                "bootstrap_host": c.net.p_host, "bootstrap_port": c.boot, "bootstrap_room": 78}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            t0 = time.time()
            pf = pool.submit(post, c.prefill.base, "/generate", body)
            df = pool.submit(post, c.decode.base, "/generate", body)
            time.sleep(0.4)
            c.prefill.proc.send_signal(signal.SIGSTOP)
            try:
                status, err = df.result(timeout=60)
                waited = time.time() - t0
            finally:
                c.prefill.proc.send_signal(signal.SIGCONT)
            pf.result(timeout=60)  # the prefill's own answer, whatever it is, comes back
        assert status >= 400 or err.get("meta_info", {}).get("finish_reason", {}).get("type") == "abort", err
        text = json.dumps(err)
        assert "KV transfer failed" in text, text
        assert waited < 30, waited
        # Resumed: a routed request is served, and neither side holds a page or a room.
        ok = served_again(c.router.base, "Hello there", within=60)
        assert len(ok["output_ids"]) == 4
        c.assert_idle()
    finally:
        c.prefill.proc.send_signal(signal.SIGCONT)
        c.close()


def test_datagram_loss_on_the_kv_link_leaves_answers_unchanged(identity, unified):
    net_ok = os.geteuid() == 0 and shutil.which("ip")
    if not net_ok:
        pytest.skip("needs root for network namespaces and nftables: the KV link is loopback here")
    if shutil.which("nft") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "nftables"], capture_output=True, timeout=300)
    if shutil.which("nft") is None:
        pytest.skip("nftables (nft) is not installed and could not be installed")
    c = Cluster(identity)
    if not c.net.netns:
        c.close()
        pytest.skip("network namespaces are unavailable here: the KV link is loopback")
    try:
        # Drop 5% of the UDP datagrams arriving on the decode side of the KV link.
        rules = (f"table inet sglrs_loss {{\n chain in {{\n  type filter hook input priority 0;\n"
                 f"  iifname \"{c.net.kv_dev}\" udp sport {c.boot} numgen random mod 100 < 5 counter drop\n }}\n}}\n")
        r = subprocess.run([*c.net.prefix(c.net.d_ns), "nft", "-f", "-"], input=rules, text=True,
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        body = lambda p: {"text": LONG[:2000] + p, "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        for p in PROMPTS[:6]:
            rs, routed = post(c.router.base, "/generate", body(p))
            us, direct = post(unified.base, "/generate", body(p))
            assert rs == 200 and us == 200, routed
            assert routed["output_ids"] == direct["output_ids"], p
        dropped = sh(*c.net.prefix(c.net.d_ns), "nft", "list", "table", "inet", "sglrs_loss").stdout
        packets = int(dropped.split("counter packets")[1].split()[0])
        assert packets > 0, dropped
        c.assert_idle()
    finally:
        c.close()


def test_a_host_with_another_identity_is_refused_at_the_handshake(identity):
    other = tempfile.mkdtemp(prefix="sglrs-id-other-")
    try:
        subprocess.run([BINARY, "cluster-identity", "--out", other], check=True, capture_output=True)
        c = Cluster(identity, decode_identity=other)
        try:
            t0 = time.time()
            status, err = post(c.decode.base, "/generate",
                               {"text": "Hello", "sampling_params": {"max_new_tokens": 4},
                                "bootstrap_host": c.net.p_host, "bootstrap_port": c.boot, "bootstrap_room": 9})
            assert time.time() - t0 < 15
            text = json.dumps(err).lower()
            assert "kv transfer failed" in text, text
            assert any(w in text for w in ("certificate", "tls", "handshake", "authentication")), text
            d = info(c.decode.base)
            assert d["cache"]["running_pages"] == 0 and d["disaggregation"]["rooms_open"] == 0, d
        finally:
            c.close()
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_small_mtu_kv_link_still_carries_the_pages(identity, unified):
    """The KV link carries 1,280-byte packets only (a tunnel, say): the handshake starts at
    1,200 bytes and path MTU discovery stays below the link's size."""
    if not (os.geteuid() == 0 and shutil.which("ip")):
        pytest.skip("needs root for network namespaces: the KV link is loopback here")
    c = Cluster(identity, timeout="15", kv_mtu=1280)
    if not c.net.netns:
        c.close()
        pytest.skip("network namespaces are unavailable here: the KV link is loopback")
    try:
        body = {"text": LONG[:3000], "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        rs, routed = post(c.router.base, "/generate", body)
        us, direct = post(unified.base, "/generate", body)
        assert rs == 200 and us == 200, routed
        assert routed["output_ids"] == direct["output_ids"]
        assert routed["meta_info"]["disaggregation"]["pages_received"] > 10
        c.assert_idle()
    finally:
        c.close()


def test_a_decode_request_dropped_while_queued_leaves_no_entry_behind(identity):
    """A decode request whose client leaves before it is admitted (so before its import
    starts) is aborted while queued, and its bootstrap entry goes with it."""
    net = Network.__new__(Network)  # loopback: no namespaces needed here
    net.netns, net.created, net.p_ns, net.d_ns = False, [], None, None
    d = Proc(net, None, "127.0.0.1", "--disaggregation-mode", "decode", "--cluster-identity", identity,
             "--max-running-requests", "1")
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            # Occupies the only running place (no bootstrap fields: it runs whole here).
            busy = pool.submit(post, d.base, "/generate", {
                "text": "Tell me a long story.", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}})
            time.sleep(0.5)
            body = json.dumps({"text": "Hello", "sampling_params": {"max_new_tokens": 4},
                               "bootstrap_host": "127.0.0.1", "bootstrap_port": 9, "bootstrap_room": 5}).encode()
            host, port = d.base.rsplit("/", 1)[1].split(":")
            with socket.create_connection((host, int(port))) as conn:
                conn.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                time.sleep(0.5)
                assert info(d.base)["disaggregation"]["awaiting_import"] == 1
            # The client is gone while its request waits for the running place.
            deadline = time.time() + 10
            while True:
                s = info(d.base)
                if s["disaggregation"]["awaiting_import"] == 0 and s["num_waiting_reqs"] == 0:
                    break
                assert time.time() < deadline, s
                time.sleep(0.2)
            assert busy.result(timeout=120)[0] == 200
        s = info(d.base)
        assert s["disaggregation"]["scheduler"]["imports_started"] == 0, s["disaggregation"]
    finally:
        d.stop()
