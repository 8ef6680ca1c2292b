#!/usr/bin/env python3
"""Offline checks of the Kubernetes manifests in deploy/ (run by `make test`).

- every built-in kind is validated against the Kubernetes 1.30 OpenAPI schemas bundled with
  the `kubernetes-validate` package (strict: unknown fields are errors);
- the kinds it has no schema for (kustomizations, InferencePool, HTTPRoute, the EPP's
  EndpointPickerConfig inside its ConfigMap) get hand-written checks of their required fields;
- every httpGet probe asks a route sglrs serves, on the container's HTTP port;
- every flag given to `sglrs serve` / `sglrs kv-store` is in that subcommand's `--help`
  (binary: $SGLRS_BIN, else $CARGO_TARGET_DIR/release/sglrs, else
  ~/.cache/sglrs/target/release/sglrs), and every sglang-router flag in its launcher's
  `--help` when sglang_router is installed;
- names resolve: Secrets, ConfigMaps, Services' selectors and target ports, the pool's
  selector and endpoint picker, the route's backends, $(VAR)s in args.

SGLRS_ALLOW_MISSING_FLAGS=--a,--b lets the listed flags be absent from --help (for a flag
that is about to land). Exits 1 with every problem listed.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"

# The routes `sglrs serve` answers (runtime/server); probes may only ask these.
SGLRS_ROUTES = {
    "/health",
    "/health_generate",
    "/get_server_info",
    "/get_load",
    "/metrics",
    "/v1/models",
}
SGLRS_SUBCOMMANDS = ("serve", "kv-store")
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}

errors = []
checked = {}  # kind -> how it was checked


def fail(where, msg):
    errors.append(f"{where}: {msg}")


def note(kind, how):
    checked.setdefault(kind, set()).add(how)


def sglrs_bin():
    if os.environ.get("SGLRS_BIN"):
        return Path(os.environ["SGLRS_BIN"])
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "sglrs"
    return Path.home() / ".cache" / "sglrs" / "target" / "release" / "sglrs"


def help_flags(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {out.returncode}: {out.stderr.strip()[:300]}")
    flags = set()
    for word in out.stdout.replace(",", " ").replace("[", " ").replace("]", " ").split():
        if word.startswith("--") and len(word) > 2:
            flags.add(word.split("=")[0].rstrip(".:"))
    return flags


def load_docs():
    """(path, index, doc) for every YAML document under deploy/."""
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        try:
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
                if doc is not None:
                    docs.append((path.relative_to(ROOT), i, doc))
        except yaml.YAMLError as e:
            fail(path.relative_to(ROOT), f"not YAML: {e}")
    return docs


def where(path, i, doc):
    return f"{path}[{i}] {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"


# --- kinds without a bundled schema ---------------------------------------------------------


def check_kustomization(path, doc, w):
    note("Kustomization", "hand: resources exist, generators named")
    base = (ROOT / path).parent
    for res in doc.get("resources") or []:
        target = base / res
        if not (target.is_file() or (target / "kustomization.yaml").is_file()):
            fail(w, f"resource {res!r} is neither a file nor a folder with a kustomization.yaml")
    for gen in doc.get("secretGenerator") or []:
        if not gen.get("name"):
            fail(w, "a secretGenerator without a name")
        # The identity's files are made at deploy time (sglrs cluster-identity): names only.
        for f in gen.get("files") or []:
            if not isinstance(f, str) or not f:
                fail(w, f"secretGenerator {gen.get('name')}: bad file entry {f!r}")


def require(w, obj, dotted):
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur or cur[part] in (None, "", [], {}):
            fail(w, f"missing required field {dotted}")
            return None
        cur = cur[part]
    return cur


def valid_port(n):
    return isinstance(n, int) and 1 <= n <= 65535


def check_inference_pool(doc, w):
    note("InferencePool", "hand: selector, targetPorts, endpointPickerRef")
    api = doc.get("apiVersion")
    if api != "inference.networking.k8s.io/v1":
        fail(w, f"apiVersion {api!r}: these checks know inference.networking.k8s.io/v1")
        return
    spec = doc.get("spec") or {}
    require(w, spec, "selector.matchLabels")
    ports = require(w, spec, "targetPorts") or []
    if not isinstance(ports, list) or not 1 <= len(ports) <= 8:
        fail(w, "targetPorts must list 1 to 8 ports")
    for p in ports if isinstance(ports, list) else []:
        if not valid_port((p or {}).get("number")):
            fail(w, f"targetPorts entry {p!r} has no valid number")
    require(w, spec, "endpointPickerRef.name")
    if not valid_port(((spec.get("endpointPickerRef") or {}).get("port") or {}).get("number")):
        fail(w, "endpointPickerRef.port.number is required (the EPP Service's port)")
    mode = (spec.get("endpointPickerRef") or {}).get("failureMode")
    if mode not in (None, "FailOpen", "FailClose"):
        fail(w, f"endpointPickerRef.failureMode {mode!r} is not FailOpen or FailClose")


def check_http_route(doc, w):
    note("HTTPRoute", "hand: parentRefs, rules, backendRefs")
    if doc.get("apiVersion") not in ("gateway.networking.k8s.io/v1", "gateway.networking.k8s.io/v1beta1"):
        fail(w, f"apiVersion {doc.get('apiVersion')!r} is not gateway.networking.k8s.io/v1")
    spec = doc.get("spec") or {}
    for ref in require(w, spec, "parentRefs") or []:
        if not (ref or {}).get("name"):
            fail(w, "a parentRef without a name")
    for rule in require(w, spec, "rules") or []:
        for b in require(w, rule, "backendRefs") or []:
            if not (b or {}).get("name"):
                fail(w, "a backendRef without a name")


def check_epp_config(text, w):
    note("EndpointPickerConfig", "hand: plugins have types, profiles name declared plugins")
    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        fail(w, f"EndpointPickerConfig is not YAML: {e}")
        return
    if cfg.get("kind") != "EndpointPickerConfig":
        fail(w, "ConfigMap data is not an EndpointPickerConfig")
        return
    names = set()
    for p in cfg.get("plugins") or []:
        if not (p or {}).get("type"):
            fail(w, f"plugin without a type: {p!r}")
            continue
        names.add(p.get("name") or p["type"])
    if not names:
        fail(w, "EndpointPickerConfig declares no plugins")
    for prof in require(w, cfg, "schedulingProfiles") or []:
        for ref in (prof or {}).get("plugins") or []:
            if ref.get("pluginRef") not in names:
                fail(w, f"profile {prof.get('name')!r} names undeclared plugin {ref.get('pluginRef')!r}")
    prefix = [p for p in cfg.get("plugins") or [] if "prefix-cache" in (p or {}).get("type", "")]
    for p in prefix:
        kv = ((p.get("parameters") or {}).get("kvEventsConfig")) or {}
        if kv.get("discoverPods") and not valid_port((kv.get("podDiscoveryConfig") or {}).get("socketPort")):
            fail(w, "kvEventsConfig.discoverPods needs podDiscoveryConfig.socketPort")


# --- pods -----------------------------------------------------------------------------------


def pod_template(doc):
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Pod":
        return {"metadata": doc.get("metadata") or {}, "spec": spec}
    return spec.get("template") or {}


def container_ports(c):
    return {p.get("name"): p for p in c.get("ports") or [] if p.get("name")}


def resolve_port(c, port):
    if isinstance(port, int):
        return port
    p = container_ports(c).get(port)
    return p.get("containerPort") if p else None


def flag_value(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def sglrs_subcommand(c):
    args = [str(a) for a in (c.get("command") or [])[1:] + (c.get("args") or [])]
    if args and args[0] in SGLRS_SUBCOMMANDS and str(c.get("image", "")).split(":")[0].endswith("sglrs"):
        return args[0], args[1:]
    return None, None


def router_args(c):
    cmd = [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]
    if "sglang_router.launch_router" in cmd:
        return cmd[cmd.index("sglang_router.launch_router") + 1 :]
    return None


def check_container(c, w, sglrs_flags, router_flags, allowed_missing, used_flags):
    name = f"{w} container {c.get('name')}"
    env = {e.get("name") for e in c.get("env") or []}
    for a in (c.get("command") or []) + (c.get("args") or []):
        s = str(a)
        while "$(" in s:
            var = s.split("$(", 1)[1].split(")", 1)[0]
            if var not in env:
                fail(name, f"$({var}) in args, but no env {var} in this container")
            s = s.split("$(", 1)[1]
    sub, args = sglrs_subcommand(c)
    http_port = None
    if sub == "serve":
        http_port = int(flag_value(args, "--port") or 30000)
        named = container_ports(c).get("http")
        if not named or named.get("containerPort") != http_port:
            fail(name, f"no container port named http on --port {http_port}")
    if sub:
        for a in args:
            if a.startswith("--"):
                flag = a.split("=", 1)[0]
                used_flags.add((sub, flag))
                if flag not in sglrs_flags[sub] and flag not in allowed_missing:
                    fail(name, f"`sglrs {sub}` has no flag {flag} (not in its --help)")
    rargs = router_args(c)
    if rargs is not None:
        if router_flags is None:
            note("sglang-router flags", "skipped: sglang_router not installed")
        else:
            note("sglang-router flags", "python3 -m sglang_router.launch_router --help")
            for a in rargs:
                if a.startswith("--") and a.split("=", 1)[0] not in router_flags:
                    fail(name, f"sglang-router has no flag {a.split('=', 1)[0]}")
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c.get(kind)
        if not probe or "httpGet" not in probe:
            continue
        get = probe["httpGet"]
        path = get.get("path")
        if path not in SGLRS_ROUTES:
            fail(name, f"{kind} asks {path!r}, not a route sglrs serves ({', '.join(sorted(SGLRS_ROUTES))})")
        port = resolve_port(c, get.get("port"))
        if port is None:
            fail(name, f"{kind} port {get.get('port')!r} is not a port of the container")
        elif http_port is not None and port != http_port:
            fail(name, f"{kind} port {port} is not the server's HTTP port {http_port}")
        elif http_port is None:
            fail(name, f"{kind} is an httpGet probe on a container that is not `sglrs serve`")


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def main():
    allowed_missing = {f for f in os.environ.get("SGLRS_ALLOW_MISSING_FLAGS", "").split(",") if f}
    try:
        import kubernetes_validate
    except ImportError:
        sys.exit(
            "check-manifests: needs kubernetes-validate "
            "(python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate)"
        )

    binary = sglrs_bin()
    for _ in range(10):  # the binary may be missing for a moment while it is relinked
        if binary.exists():
            break
        time.sleep(1)
    if not binary.exists():
        sys.exit(f"check-manifests: no sglrs binary at {binary} (set SGLRS_BIN or build it)")
    sglrs_flags = {sub: help_flags([str(binary), sub, "--help"]) for sub in SGLRS_SUBCOMMANDS}
    try:
        router_flags = help_flags([sys.executable, "-m", "sglang_router.launch_router", "--help"])
    except (RuntimeError, OSError, subprocess.SubprocessError):
        router_flags = None

    docs = load_docs()
    if not docs:
        sys.exit("check-manifests: no YAML under deploy/")
    objects = {}  # (kind, name) -> doc
    for path, i, doc in docs:
        objects[(doc.get("kind"), (doc.get("metadata") or {}).get("name"))] = doc
    secrets = {n for (k, n) in objects if k == "Secret"}
    for path, i, doc in docs:
        if doc.get("kind") == "Kustomization":
            secrets |= {g.get("name") for g in doc.get("secretGenerator") or []}
    pods = []  # (where, template labels, containers)
    used_flags = set()

    for path, i, doc in docs:
        w = where(path, i, doc)
        kind = doc.get("kind")
        if kind == "Kustomization":
            check_kustomization(path, doc, w)
            continue
        if kind == "InferencePool":
            check_inference_pool(doc, w)
            continue
        if kind == "HTTPRoute":
            check_http_route(doc, w)
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            note(kind, f"kubernetes-validate {K8S_VERSION} (strict)")
        except kubernetes_validate.SchemaNotFoundError:
            fail(w, f"no schema for {doc.get('apiVersion')} {kind} and no hand-written check")
            continue
        except kubernetes_validate.ValidationError as e:
            at = ".".join(str(p) for p in getattr(e, "path", []) or [])
            fail(w, f"invalid at {at or '(top)'}: {str(e).splitlines()[0]}")
            # Go on: the checks below still apply, and skipping them would report this
            # object's Services as selecting nothing.
        if kind == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                if "kind: EndpointPickerConfig" in text:
                    check_epp_config(text, f"{w} data.{key}")
        if kind in WORKLOADS or kind == "Pod":
            tmpl = pod_template(doc)
            spec = tmpl.get("spec") or {}
            labels = (tmpl.get("metadata") or {}).get("labels") or {}
            match = ((doc.get("spec") or {}).get("selector") or {}).get("matchLabels")
            if kind != "Pod" and match and not selects(match, labels):
                fail(w, "spec.selector does not select the pod template's labels")
            for v in spec.get("volumes") or []:
                if "secret" in v and v["secret"].get("secretName") not in secrets:
                    fail(w, f"volume {v['name']}: no Secret {v['secret'].get('secretName')!r}")
                if "configMap" in v and ("ConfigMap", v["configMap"].get("name")) not in objects:
                    fail(w, f"volume {v['name']}: no ConfigMap {v['configMap'].get('name')!r}")
            containers = (spec.get("initContainers") or []) + (spec.get("containers") or [])
            for c in containers:
                check_container(c, w, sglrs_flags, router_flags, allowed_missing, used_flags)
            pods.append((w, labels, spec.get("containers") or []))

    # Names that must resolve across documents.
    for (kind, name), doc in objects.items():
        w = f"{kind}/{name}"
        if kind == "Service":
            sel = (doc.get("spec") or {}).get("selector") or {}
            matched = [p for p in pods if selects(sel, p[1])]
            if not matched:
                fail(w, f"selector {sel} matches no pod template")
            for port in (doc.get("spec") or {}).get("ports") or []:
                tp = port.get("targetPort", port.get("port"))
                for pw, _, containers in matched:
                    ok = any(
                        (p.get("name") == tp if isinstance(tp, str) else p.get("containerPort") == tp)
                        and p.get("protocol", "TCP") == port.get("protocol", "TCP")
                        for c in containers
                        for p in c.get("ports") or []
                    )
                    if not ok:
                        fail(w, f"port {port.get('name')}: no {port.get('protocol', 'TCP')} container port {tp!r} in {pw}")
        if kind == "InferencePool":
            spec = doc.get("spec") or {}
            sel = (spec.get("selector") or {}).get("matchLabels") or {}
            targets = {p.get("number") for p in spec.get("targetPorts") or []}
            matched = [p for p in pods if selects(sel, p[1])]
            if not matched:
                fail(w, f"selector {sel} matches no pod template")
            for pw, _, containers in matched:
                have = {p.get("containerPort") for c in containers for p in c.get("ports") or []}
                if not targets <= have:
                    fail(w, f"targetPorts {sorted(targets)} not all served by {pw}")
            ref = spec.get("endpointPickerRef") or {}
            svc = objects.get(("Service", ref.get("name")))
            if not svc:
                fail(w, f"endpointPickerRef names no Service {ref.get('name')!r}")
            elif (ref.get("port") or {}).get("number") not in {p.get("port") for p in svc["spec"].get("ports") or []}:
                fail(w, f"endpointPickerRef port is not a port of Service {ref.get('name')}")
        if kind == "HTTPRoute":
            for rule in (doc.get("spec") or {}).get("rules") or []:
                for b in rule.get("backendRefs") or []:
                    if b.get("kind", "Service") in ("InferencePool", "Service") and (b.get("kind", "Service"), b.get("name")) not in objects:
                        fail(w, f"backendRef names no {b.get('kind', 'Service')} {b.get('name')!r}")

    for flag in sorted(allowed_missing):
        present = [sub for sub in SGLRS_SUBCOMMANDS if flag in sglrs_flags[sub]]
        if present:
            print(f"check-manifests: note: {flag} is now in `sglrs {present[0]} --help`; SGLRS_ALLOW_MISSING_FLAGS no longer needs it")
        elif any(f == flag for _, f in used_flags):
            print(f"check-manifests: warning: {flag} is not in sglrs's --help (allowed by SGLRS_ALLOW_MISSING_FLAGS)")

    print(f"check-manifests: {len(docs)} documents under deploy/, sglrs binary {binary}")
    for kind in sorted(checked):
        print(f"  {kind}: {'; '.join(sorted(checked[kind]))}")
    if errors:
        print(f"check-manifests: {len(errors)} problem(s):", file=sys.stderr)
        for e in errors:
            print(f"  {e}", file=sys.stderr)
        sys.exit(1)
    print("check-manifests: ok")


if __name__ == "__main__":
    main()
