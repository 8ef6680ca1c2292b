"""KV cache events (`--kv-events-config`), read by a subscriber written from the format alone.

The subscriber below knows only the wire format vLLM and SGLang publish (ZMQ PUB frames
`[topic, seq (8 bytes BE), msgpack EventBatch]`, array-shaped batches and events, a ROUTER
replay socket) — nothing of sglrs. From the events alone it keeps an index of the server's
cached pages, and before every request of a workload (shared system prompts, chat turns that
grow, distinct prompts that force evictions, a cache flush) it predicts the prefix the server
will reuse; the prediction must equal the server's own `cached_tokens`, request by request.

Run:  pip install pytest pyzmq msgpack
      SGLRS_BIN=…/release/sglrs python3 -m pytest -q tests/python/test_kv_events.py
"""

import json
import random
import shutil
import socket
import tempfile
import threading
import time
import urllib.request

import pytest

zmq = pytest.importorskip("zmq", reason="pyzmq is not installed (pip install pyzmq)")
msgpack = pytest.importorskip("msgpack", reason="msgpack is not installed (pip install msgpack)")

from test_reliability import Server  # noqa: E402
from test_pd import free_port  # noqa: E402

PAGE = 16
TOPIC = "kv@sglrs-test@SmolLM2-135M-Instruct"


class Index:
    """Cached blocks by (parent hash, tokens) and the media holding each ("GPU": the
    executor's pool, "CPU": host RAM, "DISK"), rebuilt from BlockStored / BlockRemoved /
    AllBlocksCleared."""

    def __init__(self):
        self.by_key = {}
        self.key_of = {}
        self.media = {}
        self.seen_media = set()

    def apply(self, event):
        tag = event[0]
        if tag == "BlockStored":
            hashes, parent, tokens, size, medium = event[1], event[2], event[3], event[4], event[6]
            assert medium in ("GPU", "CPU", "DISK"), event
            assert len(tokens) == size * len(hashes), event
            self.seen_media.add(medium)
            for i, h in enumerate(hashes):
                key = (parent if i == 0 else hashes[i - 1], tuple(tokens[i * size:(i + 1) * size]))
                assert medium not in self.media.get(h, set()), f"stored twice in {medium}: {h}"
                self.by_key[key] = h
                self.key_of[h] = key
                self.media.setdefault(h, set()).add(medium)
        elif tag == "BlockRemoved":
            hashes, medium = event[1], event[2]
            for h in hashes:
                held = self.media[h]  # a removal names a block that was stored there
                held.remove(medium)
                if not held:
                    del self.media[h]
                    del self.by_key[self.key_of.pop(h)]
        elif tag == "AllBlocksCleared":
            self.by_key.clear()
            self.key_of.clear()
            self.media.clear()
        else:
            raise AssertionError(f"unknown event {event!r}")

    def prefix(self, ids):
        """Tokens of `ids` the server reuses: whole cached pages, leaving one token to
        compute."""
        parent, n = None, 0
        for p in range((len(ids) - 1) // PAGE):
            h = self.by_key.get((parent, tuple(ids[p * PAGE:(p + 1) * PAGE])))
            if h is None:
                break
            parent, n = h, n + PAGE
        return n


class Subscriber(threading.Thread):
    def __init__(self, ctx, endpoint):
        super().__init__(daemon=True)
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, "kv@")
        self.sock.connect(endpoint)
        self.messages = []
        self.lock = threading.Lock()
        self.stop = False
        self.start()

    def run(self):
        while not self.stop:
            if self.sock.poll(100):
                topic, seq, payload = self.sock.recv_multipart()
                with self.lock:
                    self.messages.append((topic.decode(), int.from_bytes(seq, "big"), payload))

    def taken(self):
        with self.lock:
            return list(self.messages)


def info(base):
    with urllib.request.urlopen(base + "/get_server_info", timeout=30) as r:
        return json.loads(r.read())["internal_states"][0]


def generate(base, ids):
    req = urllib.request.Request(
        base + "/generate",
        data=json.dumps({"input_ids": ids,
                         "sampling_params": {"max_new_tokens": 6, "temperature": 0}}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def workload(rng):
    """Token-id prompts: two system prompts shared by many questions, a conversation that
    grows turn by turn, and long distinct prompts that push older pages out of the pool."""
    vocab = range(100, 40000)
    systems = [[rng.choice(vocab) for _ in range(n)] for n in (150, 90)]
    out = []
    chat = list(systems[0])
    for i in range(24):
        kind = i % 4
        if kind == 0:
            out.append(systems[i % 2] + [rng.choice(vocab) for _ in range(rng.randint(5, 40))])
        elif kind == 1:
            chat = chat + [rng.choice(vocab) for _ in range(rng.randint(10, 30))]
            out.append(list(chat))
        elif kind == 2:
            out.append([rng.choice(vocab) for _ in range(rng.randint(300, 500))])
        else:
            out.append(out[-3] if i > 3 else systems[1] + [7, 8, 9])
    return out


@pytest.fixture(scope="module", params=["device", "tiers"])
def server(request):
    pub, replay = free_port(), free_port()
    cfg = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}",
           "replay_endpoint": f"tcp://*:{replay}", "topic": TOPIC}
    tiers = []
    disk = tempfile.mkdtemp(prefix="sglrs-kv-events-")
    if request.param == "tiers":
        # A host tier of half the pool and a disk tier: evicted pages move down, and
        # come back as host and disk hits.
        tiers = ["--enable-hierarchical-cache", "--hicache-ratio", "0.5",
                 "--hicache-storage-backend", "file", "--hicache-storage-dir", disk]
    # A pool of ~90 pages (1,456 tokens): the distinct prompts evict.
    try:
        with Server("--threads", "1", "--kv-memory-mb", "32", "--context-length", "1024",
                    "--kv-events-config", json.dumps(cfg), *tiers) as s:
            s.pub, s.replay = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}"
            s.tiers = bool(tiers)
            yield s
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def wait_caught_up(base, sub, timeout=15):
    """Until the subscriber holds every batch the server sent and the server is idle."""
    deadline = time.time() + timeout
    while True:
        st = info(base)
        sent = st["kv_events"]["batches"]
        if len(sub.taken()) == sent and st["num_running_reqs"] == 0 and st["num_waiting_reqs"] == 0:
            time.sleep(0.05)
            if info(base)["kv_events"]["batches"] == sent:
                return sent
        assert time.time() < deadline, (sent, len(sub.taken()))
        time.sleep(0.05)


def test_an_index_built_from_events_alone_predicts_every_cached_tokens(server):
    ctx = zmq.Context()
    sub = Subscriber(ctx, server.pub)
    try:
        # The PUB socket drops what is sent before a subscriber joins: wait until joined
        # (a first request's events arrive).
        deadline = time.time() + 10
        k = 0
        while not sub.taken():
            k += 1
            generate(server.base, [30000 + k] * 40)  # two full pages, new every time
            time.sleep(0.2)
            assert time.time() < deadline, "no events reached the subscriber"
        wait_caught_up(server.base, sub)
        index = Index()
        seen = 0
        # Batches before the subscriber joined come from the replay socket.
        first = sub.taken()[0][1]
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(server.replay)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = []
        while True:
            assert dealer.poll(10_000), "the replay socket did not answer"
            _, seq, payload = dealer.recv_multipart()
            seq = int.from_bytes(seq, "big", signed=True)
            if seq == -1:
                assert payload == b""
                break
            replayed.append((seq, payload))
        assert [s for s, _ in replayed][:first] == list(range(first))
        live = {s: p for _, s, p in sub.taken()}
        for s, p in replayed:
            if s in live:
                assert live[s] == p, "replay sends the same payload"
        for _, payload in replayed[:first]:
            for e in msgpack.unpackb(payload)[1]:
                index.apply(e)

        def catch_up():
            nonlocal seen
            msgs = sub.taken()
            for topic, seq, payload in msgs[seen:]:
                assert topic == TOPIC
                assert seq == seen + first, "sequence numbers without gaps"
                ts, events, rank = msgpack.unpackb(payload)
                assert isinstance(ts, float) and rank == 0 and events
                for e in events:
                    index.apply(e)
                seen += 1

        catch_up()
        rng = random.Random(7)
        prompts = workload(rng)
        stats = {"hit": 0, "miss": 0, "lower": 0}
        for i, ids in enumerate(prompts):
            predicted = index.prefix(ids)
            meta = generate(server.base, ids)["meta_info"]
            got = meta["cached_tokens"]
            assert got == predicted, f"request {i}: server cached {got}, events predict {predicted}"
            stats["hit" if got else "miss"] += 1
            d = meta.get("cached_tokens_details") or {}
            stats["lower"] += d.get("host", 0) + d.get("disk", 0)
            if i == 14:
                # A flush: AllBlocksCleared, then nothing is cached.
                req = urllib.request.Request(server.base + "/flush_cache", data=b"", method="POST")
                urllib.request.urlopen(req, timeout=30).read()
            wait_caught_up(server.base, sub)
            catch_up()
        assert stats["hit"] >= 8 and stats["miss"] >= 4, stats
        if server.tiers:
            assert stats["lower"] > 0, f"some hits come from the lower tiers: {stats}"
            assert {"GPU", "CPU", "DISK"} <= index.seen_media, index.seen_media
        st = info(server.base)
        assert st["cache"]["evicted_pages"] > 0, "the workload evicts"
        assert st["kv_events"]["dropped_batches"] == 0
    finally:
        sub.stop = True
        sub.join(timeout=2)
        ctx.destroy(linger=0)
