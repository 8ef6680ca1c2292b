"""The hierarchical cache's remote tier: two `sglrs serve` replicas sharing one `sglrs kv-store`.

As root (CI is), each replica and the store run in their own network namespace: the test
reaches each replica's HTTP over a veth pair, and the replicas reach the store over a bridge
inside the store's namespace (one address for both). Without root everything runs on loopback.

Checked: a prompt computed on replica A is a remote hit on replica B, with the same tokens and
logprobs; a store stopped or killed mid-load costs B a recompute within the prefetch timeout,
never an error; a restarted store is redialed and hit again; a store with another cluster
identity is refused at the handshake (its pages are misses, requests still succeed).

Run:  pip install pytest openai
      SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_scale_out.py
"""

import concurrent.futures
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

from test_pd import BINARY, Namespaces, Proc, free_udp_port, identity, info, post, sh  # noqa: F401 (identity: a fixture)

# A prompt far longer than a page: ~1,000 tokens of prose, different for every seed.
WORDS = ["river", "stone", "lantern", "harbor", "meadow", "copper", "violet", "engine", "orchard",
         "signal", "winter", "canvas", "falcon", "marble", "thunder", "garden"]
PREFETCH_MS = 1500


def prose(seed, words=700):
    x = seed * 6364136223846793005 + 1442695040888963407
    out = []
    for _ in range(words):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(WORDS[(x >> 33) % len(WORDS)])
    return " ".join(out)


class Net(Namespaces):
    """Namespaces `A`, `B` (replicas) and `S` (store) when root: A and B each hang off the
    root namespace by a veth pair (the test's HTTP), and off a bridge in S that holds the
    store's address. Otherwise everything is 127.0.0.1."""

    made = 0

    def __init__(self, loopback=False):
        Net.made += 1
        self.created = []
        self.netns = not loopback and os.geteuid() == 0 and shutil.which("ip") is not None
        if self.netns:
            tag = f"{os.getpid() % 10000}{chr(96 + Net.made % 26)}"
            net = 100 + (os.getpid() * 7 + Net.made) % 100
            try:
                self._make(tag, net)
                return
            except subprocess.CalledProcessError as e:
                self.close()
                print(f"test_scale_out: network namespaces unavailable ({e.stderr.strip()}); "
                      "using loopback", file=sys.stderr)
                self.netns = False
        self.a_ns = self.b_ns = self.s_ns = None
        self.a_host = self.b_host = self.store_host = "127.0.0.1"

    def _make(self, tag, net):
        self.a_ns, self.b_ns, self.s_ns = f"sgla{tag}", f"sglb{tag}", f"sgls{tag}"
        for ns in (self.a_ns, self.b_ns, self.s_ns):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.s_ns, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.s_ns, "addr", "add", f"10.{net}.3.1/24", "dev", "br0")
        sh("ip", "-n", self.s_ns, "link", "set", "br0", "up")
        for i, ns in ((1, self.a_ns), (2, self.b_ns)):
            # HTTP from the root namespace.
            root_end, ns_end = f"r{i}{tag}", f"h{i}{tag}"
            sh("ip", "link", "add", root_end, "type", "veth", "peer", "name", ns_end)
            self.created.append(("link", root_end))
            sh("ip", "link", "set", ns_end, "netns", ns)
            sh("ip", "addr", "add", f"10.{net}.{i}.1/24", "dev", root_end)
            sh("ip", "link", "set", root_end, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.{net}.{i}.2/24", "dev", ns_end)
            sh("ip", "-n", ns, "link", "set", ns_end, "up")
            # The store's bridge.
            s_end, n_end = f"s{i}{tag}", f"k{i}{tag}"
            sh("ip", "link", "add", s_end, "type", "veth", "peer", "name", n_end)
            sh("ip", "link", "set", s_end, "netns", self.s_ns)
            sh("ip", "link", "set", n_end, "netns", ns)
            sh("ip", "-n", self.s_ns, "link", "set", s_end, "master", "br0")
            sh("ip", "-n", self.s_ns, "link", "set", s_end, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.{net}.3.{i + 1}/24", "dev", n_end)
            sh("ip", "-n", ns, "link", "set", n_end, "up")
        self.a_host, self.b_host, self.store_host = f"10.{net}.1.2", f"10.{net}.2.2", f"10.{net}.3.1"


class Store:
    """`sglrs kv-store` in the store's namespace."""

    def __init__(self, net, identity, port=None):
        self.net, self.identity = net, identity
        self.port = port or free_udp_port()
        self.addr = f"{net.store_host}:{self.port}"
        self.start()

    def start(self):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [*self.net.prefix(self.net.s_ns), BINARY, "kv-store", "--listen", self.addr,
             "--ram-gb", "0.5", "--cluster-identity", self.identity],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 60
        while True:
            self.log.seek(0)
            if b"KV store on" in self.log.read():
                return
            assert self.proc.poll() is None and time.time() < deadline, "kv-store did not come up"
            time.sleep(0.1)

    def signal(self, sig):
        self.proc.send_signal(sig)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


def replica(net, ns, host, identity, store_addr, *flags):
    return Proc(net, ns, host, "--enable-hierarchical-cache", "--hicache-storage-backend", "quic",
                "--hicache-storage-addr", store_addr, "--cluster-identity", identity,
                "--hicache-storage-prefetch-timeout-ms", str(PREFETCH_MS), *flags)


def ask(s, text):
    status, v = post(s.base, "/generate",
                     {"text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0},
                      "return_logprob": True, "top_logprobs_num": 5})
    assert status == 200, v
    return v


def answer(v):
    m = v["meta_info"]
    return [v["text"], m["output_token_logprobs"], m["output_top_logprobs"]]


def remote(s):
    return info(s.base)["hicache_remote"]


def wait_written(s, timeout=30):
    """Until replica `s` has no remote write in flight; returns its remote-tier info."""
    deadline = time.time() + timeout
    while True:
        r = remote(s)
        if not r["writes_pending"] and r["written_pages"] + r["skipped_pages"] + r["dropped_pages"] > 0:
            return r
        assert time.time() < deadline, r
        time.sleep(0.1)


def wait_connected(s, connects, timeout=30):
    deadline = time.time() + timeout
    while True:
        st = remote(s)["stores"][0]
        if st["state"] == "connected" and st["connects"] >= connects:
            return st
        assert time.time() < deadline, st
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster(identity):
    net = Net()
    parts = []
    try:
        store = Store(net, identity)
        parts.append(store)
        a = replica(net, net.a_ns, net.a_host, identity, store.addr)
        parts.append(a)
        b = replica(net, net.b_ns, net.b_host, identity, store.addr)
        parts.append(b)
        yield net, store, a, b
    finally:
        for p in reversed(parts):
            p.kill() if isinstance(p, Store) else p.stop()
        net.close()


def nothing_held(server, within: float = 30.0) -> None:
    """No page or lock is held once the server's last write-through is done. Its pin lasts
    while the cache I/O thread writes the pages down, to the store too (a write to a store
    that is gone waits its 5 s timeout), so this waits, bounded."""
    deadline = time.time() + within
    st = info(server.base)
    while st["cache"]["running_pages"] or st["cache"]["held_locks"]:
        assert time.time() < deadline, st
        time.sleep(0.05)
        st = info(server.base)


def test_a_prompt_computed_on_one_replica_is_a_remote_hit_on_the_other(cluster):
    net, store, a, b = cluster
    text = prose(1)
    cold = ask(a, text)
    assert cold["meta_info"]["cached_tokens"] == 0
    r = wait_written(a)
    assert r["written_pages"] > 10 and r["stores"][0]["state"] == "connected", r
    hit = ask(b, text)
    m = hit["meta_info"]
    n = m["prompt_tokens"]
    assert m["cached_tokens_details"]["remote"] == (n - 1) // 16 * 16, m
    assert m["cached_tokens"] == m["cached_tokens_details"]["remote"], m
    assert answer(hit) == answer(cold), "the fetched pages give the same tokens and logprobs"
    rb = remote(b)
    assert rb["hit_pages"] == (n - 1) // 16 and rb["read_timeouts"] == 0, rb
    st = info(b.base)
    assert st["cached_tokens_by_source"]["remote"] == m["cached_tokens"], st
    nothing_held(b)
    # The counters are in /metrics too.
    with urllib.request.urlopen(b.base + "/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    assert "sglang:cached_tokens_total{" in metrics and 'cache_source="remote"' in metrics
    assert "sglrs_hicache_remote_hit_pages_total" in metrics


def test_a_stopped_or_killed_store_costs_a_recompute_within_the_prefetch_timeout(cluster):
    net, store, a, b = cluster
    texts = [prose(10 + i) for i in range(3)]
    colds = [ask(a, t) for t in texts]
    wait_written(a)
    # A store that hangs: B's fetch waits the prefetch timeout, then recomputes.
    store.signal(signal.SIGSTOP)
    try:
        t0 = time.time()
        v = ask(b, texts[0])
        took = time.time() - t0
        assert answer(v) == answer(colds[0])
        assert v["meta_info"]["cached_tokens"] == 0, v["meta_info"]
        assert took < PREFETCH_MS / 1000 + 20, took
        assert remote(b)["read_timeouts"] >= 1
    finally:
        store.signal(signal.SIGCONT)
    # Killed while B's requests are on their way.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(ask, b, t) for t in texts[1:]]
        time.sleep(0.05)
        store.kill()
        got = [f.result(timeout=120) for f in futs]
    for v, c in zip(got, colds[1:]):
        assert answer(v) == answer(c), "recomputed or fetched, the answer is the same"
    # With the store gone, new requests are misses within the timeout, never errors.
    t0 = time.time()
    v = ask(b, prose(20))
    assert v["meta_info"]["cached_tokens_details"]["remote"] == 0
    assert time.time() - t0 < PREFETCH_MS / 1000 + 20
    nothing_held(b)
    # Restarted (empty: a kill loses the store's RAM): both replicas redial, and what A
    # computes next is a hit on B again.
    before = remote(b)["stores"][0]["connects"]
    store.start()
    wait_connected(a, before + 1)
    wait_connected(b, before + 1)
    text = prose(30)
    cold = ask(a, text)
    wait_written(a)
    hit = ask(b, text)
    assert hit["meta_info"]["cached_tokens_details"]["remote"] > 0, hit["meta_info"]
    assert answer(hit) == answer(cold)


def test_a_store_with_another_cluster_identity_is_refused(identity):
    other = tempfile.mkdtemp(prefix="sglrs-id-other-")
    net = Net()
    store = s = None
    try:
        subprocess.run([BINARY, "cluster-identity", "--out", other], check=True, capture_output=True)
        store = Store(net, other)
        s = replica(net, net.a_ns, net.a_host, identity, store.addr)
        st = remote(s)["stores"][0]
        assert st["state"] != "connected", st
        deadline = time.time() + 15
        while not st["reason"]:
            assert time.time() < deadline, st
            time.sleep(0.2)
            st = remote(s)["stores"][0]
        reason = st["reason"].lower()
        assert any(w in reason for w in ("certificate", "tls", "handshake", "identity", "secret")), st
        t0 = time.time()
        v = ask(s, prose(40, 200))
        assert v["meta_info"]["cached_tokens"] == 0
        assert time.time() - t0 < 20
        assert remote(s)["hit_pages"] == 0
    finally:
        if s is not None:
            s.stop()
        if store is not None:
            store.kill()
        net.close()
        shutil.rmtree(other, ignore_errors=True)


def test_a_decode_server_offloads_what_it_computed_for_the_next_turns_prefill(identity):
    """Prefill and decode share the store; the decode server offloads its pages
    (`--disaggregation-decode-enable-offload-kvcache`), so the next turn's prefill finds
    the first turn's output pages in the remote tier."""
    net_lo = Net(loopback=True)  # the PD pair and its store on loopback
    parts = []
    try:
        store = Store(net_lo, identity)
        parts.append(store)
        boot = free_udp_port()
        prefill = replica(net_lo, None, "127.0.0.1", identity, store.addr,
                          "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot))
        parts.append(prefill)
        decode = replica(net_lo, None, "127.0.0.1", identity, store.addr,
                         "--disaggregation-mode", "decode", "--disaggregation-decode-enable-offload-kvcache")
        parts.append(decode)
        text = prose(50, 300)
        body = {"text": text, "sampling_params": {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True},
                "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": 5}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pf = pool.submit(post, prefill.base, "/generate", body)
            df = pool.submit(post, decode.base, "/generate", body)
            ps, _ = pf.result(timeout=120)
            ds, first = df.result(timeout=120)
        assert ps == 200 and ds == 200, first
        n1 = first["meta_info"]["prompt_tokens"]
        # The decode server writes through every full page it holds once the request ends:
        # the prompt's (skipped where the prefill server's write got there first) and those
        # its output completes (48 tokens: at least two). Its first write may come at the
        # import, before the request's end, so the wait is for all of them.
        full = (n1 + 48 - 1) // 16
        deadline = time.time() + 30
        while True:
            r = remote(decode)
            if r["written_pages"] + r["skipped_pages"] >= full and not r["writes_pending"]:
                break
            assert time.time() < deadline, (full, r)
            time.sleep(0.1)
        # The next turn, prefilled (here whole, on the prefill server): the first turn's
        # prompt is on its device, the output pages come from the decode server's offload.
        follow = text + first["text"] + " and then"
        status, second = post(prefill.base, "/generate",
                              {"text": follow, "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        assert status == 200, second
        d = second["meta_info"]["cached_tokens_details"]
        assert d["remote"] >= 32, (d, n1, remote(decode), remote(prefill))
        assert d["device"] + d["remote"] > n1, (d, n1)
    finally:
        for p in reversed(parts):
            p.kill() if isinstance(p, Store) else p.stop()


def test_offload_flags_that_cannot_work_are_refused_by_name():
    for flags, named in (
        (["--disaggregation-decode-enable-offload-kvcache"], "--disaggregation-mode decode"),
        (["--enable-hierarchical-cache", "--hicache-storage-backend", "quic"], "--hicache-storage-addr"),
        (["--enable-hierarchical-cache", "--hicache-storage-backend", "quic",
          "--hicache-storage-addr", "127.0.0.1:1"], "--cluster-identity"),
    ):
        r = subprocess.run([BINARY, "serve", "--port", "1", *flags], capture_output=True, text=True,
                           timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "SGLRS_CLUSTER_IDENTITY"})
        assert r.returncode != 0 and named in r.stderr, (flags, r.stderr[-500:])
