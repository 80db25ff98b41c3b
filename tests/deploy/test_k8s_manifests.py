"""deploy/k8s: every manifest is valid Kubernetes (strict schemas, offline), the KEDA objects match KEDA's
CRDs, and the pieces agree with each other and with what Sluice really does: the pipeline in the ConfigMap
passes ``sluice validate``, the pod waits longer than the drain, the probes hit endpoints Sluice serves, and
KEDA watches the group and topic the pods consume.

Core kinds: ``kubernetes-validate`` (PyPI; bundles the Kubernetes JSON schemas, no network) in strict mode,
so an unknown or misspelt key fails. KEDA kinds: ``keda_v1alpha1.schema.json`` beside this file, a
hand-written subset of KEDA's CRD schemas (no registry package ships them for this Python).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import CollectorRegistry

from sluice.config import parse_pipeline
from sluice.telemetry.http import TelemetryServer
from tests.integration.pipelines import ROOT, run_sluice

K8S_DIR = ROOT / "deploy" / "k8s"
KEDA_SCHEMA = Path(__file__).with_name("keda_v1alpha1.schema.json")
# The oldest Kubernetes release still commonly run, and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
PARTITIONS = 6  # of the input topic the example pipeline reads; documented in keda.yaml


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, for every manifest in deploy/k8s (kustomization.yaml aside)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(K8S_DIR.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def _one(kind: str) -> dict[str, Any]:
    matches = [obj for (k, _), obj in _objects().items() if k == kind]
    assert len(matches) == 1, f"expected one {kind} in deploy/k8s, found {len(matches)}"
    return matches[0]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "sluice")


def _pipeline_env(deployment: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would set it (ConfigMap keys resolved, secrets dummy)."""
    configmap = _one("ConfigMap")["data"]
    env = {}
    for var in _container(deployment)["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            env[var["name"]] = configmap[var["valueFrom"]["configMapKeyRef"]["key"]]
        else:
            env[var["name"]] = f"dummy-{var['name'].lower()}"
    return env


def _loaded_pipeline() -> Any:
    deployment = _one("Deployment")
    return parse_pipeline(_one("ConfigMap")["data"]["pipeline.yaml"], environ=_pipeline_env(deployment)).pipeline


# ------------------------------------------------------------------------------ schemas


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_manifests_validate_against_the_kubernetes_schemas(version: str) -> None:
    from kubernetes_validate import utils as kubernetes_validate

    core = {key: obj for key, obj in _objects().items() if not obj["apiVersion"].startswith("keda.sh/")}
    assert {kind for kind, _ in core} == {"ConfigMap", "Secret", "Deployment", "Service", "Job"}
    for (kind, name), obj in core.items():
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{kind}/{name} is not valid Kubernetes {version}: {path}: {err.message}")


def test_the_checker_rejects_a_misspelt_key() -> None:
    """The strict schemas really are strict: a typo in a probe name fails (else the test above proves little)."""
    from kubernetes_validate import utils as kubernetes_validate

    deployment = json.loads(json.dumps(_one("Deployment")))
    _container(deployment)["readinessProb"] = _container(deployment).pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinessProb"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_keda_objects_validate_against_the_keda_crd_schema() -> None:
    schema = json.loads(KEDA_SCHEMA.read_text())
    keda = {key: obj for key, obj in _objects().items() if obj["apiVersion"].startswith("keda.sh/")}
    assert {kind for kind, _ in keda} == {"ScaledObject", "TriggerAuthentication"}
    for (kind, name), obj in keda.items():
        validator = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{kind}"})
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(obj)]
        assert not errors, f"{kind}/{name}: {errors}"

    broken = json.loads(json.dumps(_one("ScaledObject")))
    broken["spec"]["maxReplicasCount"] = broken["spec"].pop("maxReplicaCount")
    broken["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"
    validator = jsonschema.Draft202012Validator({**schema, "$ref": "#/$defs/ScaledObject"})
    messages = " ".join(e.message for e in validator.iter_errors(broken))
    assert "maxReplicasCount" in messages and "lagTreshold" in messages


def test_kustomization_lists_every_manifest_but_the_job() -> None:
    """The Job runs on demand (its pod template is immutable once created): applied on its own."""
    listed = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())["resources"]
    present = sorted(p.name for p in K8S_DIR.glob("*.yaml") if p.name not in ("kustomization.yaml", "job.yaml"))
    assert sorted(listed) == present


# ------------------------------------------------------------------------------ the pieces agree


def test_the_configmap_pipeline_passes_sluice_validate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = _one("Deployment")
    pipeline = tmp_path / "pipeline.yaml"
    pipeline.write_text(_one("ConfigMap")["data"]["pipeline.yaml"])
    for name, value in _pipeline_env(deployment).items():
        monkeypatch.setenv(name, value)
    proc = run_sluice("validate", str(pipeline), timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout
    assert "dummy-kafka_password" not in proc.stdout + proc.stderr  # the Secret's value is never printed


def test_every_pipeline_variable_is_set_by_the_deployment() -> None:
    """A ${VAR} without a default and without an env entry would stop every pod at start."""
    import re

    text = _one("ConfigMap")["data"]["pipeline.yaml"]
    wanted = {m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)}
    assert wanted <= set(_pipeline_env(_one("Deployment")))


def test_the_pod_waits_longer_than_the_drain() -> None:
    grace_s = _one("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    drain_s = _loaded_pipeline().runtime.drain_timeout_s
    # SIGTERM -> drain (up to drain_timeout_s) -> flush and commit -> exit; SIGKILL comes after the grace period.
    assert grace_s >= drain_s + 10, f"terminationGracePeriodSeconds {grace_s} leaves no margin over drain {drain_s}s"


def test_probes_hit_the_endpoints_sluice_serves_on_the_port_it_binds() -> None:
    pipeline = _loaded_pipeline()
    metrics = pipeline.telemetry.metrics
    assert metrics.enabled and metrics.host == "0.0.0.0", "probes come from outside the pod's loopback"
    container = _container(_one("Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probes = {kind: container[kind]["httpGet"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    for probe in probes.values():
        assert ports[probe["port"]] == metrics.port
    service_port = _one("Service")["spec"]["ports"][0]
    assert ports[service_port["targetPort"]] == metrics.port

    # Ask Sluice's own HTTP server, once not ready and once ready, what those paths answer.
    reason: list[str | None] = ["warming up"]
    server = TelemetryServer("127.0.0.1", 0, CollectorRegistry(), lambda: reason[0])
    try:
        def status(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=5) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as err:
                return err.code

        assert status(probes["livenessProbe"]["path"]) == 200  # alive while the model loads
        assert status(probes["startupProbe"]["path"]) == 200
        assert status(probes["readinessProbe"]["path"]) == 503  # not ready yet: no traffic, no rollout step
        reason[0] = None
        assert status(probes["readinessProbe"]["path"]) == 200
        assert status(_one("Service")["metadata"]["annotations"]["prometheus.io/path"]) == 200
    finally:
        server.close()


def test_keda_scales_on_the_lag_of_the_group_the_pods_consume_in() -> None:
    pipeline = _loaded_pipeline()
    scaled = _one("ScaledObject")
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] == _one("Deployment")["metadata"]["name"]
    (trigger,) = spec["triggers"]
    meta = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert meta["consumerGroup"] == pipeline.source.kafka.group_id
    assert [meta["topic"]] == pipeline.source.kafka.topics
    assert meta["bootstrapServers"] == pipeline.source.kafka.bootstrap_servers
    assert meta["offsetResetPolicy"] == pipeline.source.kafka.auto_offset_reset
    # Partitions bound the useful replicas: more members than partitions only idle.
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= PARTITIONS
    assert meta.get("allowIdleConsumers", "false") == "false"


def test_keda_authenticates_like_the_pods_with_keys_the_secret_has() -> None:
    secret = _one("Secret")["stringData"]
    pipeline = _loaded_pipeline()
    auth = _one("TriggerAuthentication")
    assert _one("ScaledObject")["spec"]["triggers"][0]["authenticationRef"]["name"] == auth["metadata"]["name"]
    refs = {ref["parameter"]: ref for ref in auth["spec"]["secretTargetRef"]}
    assert all(ref["name"] == _one("Secret")["metadata"]["name"] and ref["key"] in secret for ref in refs.values())
    sasl = pipeline.source.kafka.security.sasl
    keda_mechanism = {"PLAIN": "plaintext", "SCRAM-SHA-256": "scram_sha256", "SCRAM-SHA-512": "scram_sha512"}
    assert secret[refs["sasl"]["key"]] == keda_mechanism[sasl.mechanism]
    assert secret[refs["tls"]["key"]] == ("enable" if pipeline.source.kafka.security.tls else "disable")
    for var in _container(_one("Deployment"))["env"]:
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == _one("Secret")["metadata"]["name"] and ref["key"] in secret


# ------------------------------------------------------------------------------ the bounded re-index Job


def _job_pipeline_text() -> str:
    job = _one("Job")
    (volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    (item,) = volume["configMap"]["items"]
    return str(_one("ConfigMap")["data"][item["key"]])


def test_the_job_runs_its_pipeline_until_the_end_and_sluice_takes_those_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.cli import _parser

    job = _one("Job")
    container = _container(job)
    args = _parser().parse_args(container["args"])
    assert args.until_end and args.pipeline == Path("/etc/sluice/reindex.yaml")
    pipeline = tmp_path / "reindex.yaml"
    pipeline.write_text(_job_pipeline_text())
    for name, value in _pipeline_env(job).items():
        monkeypatch.setenv(name, value)
    proc = run_sluice("validate", str(pipeline), timeout_s=120)
    assert proc.returncode == 0, proc.stderr


def test_the_job_consumes_in_a_group_of_its_own_and_is_retried_from_its_commits() -> None:
    """In the Deployment's group the Job would take partitions from the live consumers; exiting 0 must
    complete it; a crash restarts the container in the same pod (same static membership id)."""
    import re

    job = _one("Job")
    text = _job_pipeline_text()
    wanted = {m.group(1) for m in re.finditer(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)}
    assert wanted <= set(_pipeline_env(job))
    reindex = parse_pipeline(text, environ=_pipeline_env(job)).pipeline
    live = _loaded_pipeline()
    assert reindex.source.kafka.group_id != live.source.kafka.group_id
    assert reindex.source.kafka.topics == live.source.kafka.topics
    assert reindex.sink.kafka.topic != live.sink.kafka.topic
    spec = job["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "OnFailure" and spec["backoffLimit"] >= 1
    assert 1 <= spec["parallelism"] == spec["completions"] <= PARTITIONS
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= reindex.runtime.drain_timeout_s + 10
    assert _container(job)["image"] == _container(_one("Deployment"))["image"]
