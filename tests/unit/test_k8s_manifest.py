"""The Kubernetes manifests (infra/k8s/) hold what a rollout of a new build relies on."""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

import yaml

from artemis.config import Settings, WorkerSettings

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"


def docs(name: str, **values: str) -> list[dict]:
    """The manifest as envsubst fills it (its comments hold shell lines: left alone)."""
    text = Template((K8S / name).read_text(encoding="utf-8")).safe_substitute(values)
    unfilled = [line for line in text.splitlines() if "${" in line.split("#")[0]]
    assert not unfilled, unfilled
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(items: list[dict], kind: str) -> list[dict]:
    return [d for d in items if d["kind"] == kind]


def container(workload: dict) -> dict:
    """The one container of a Deployment's or a Job's pod."""
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def test_each_build_has_a_worker_deployment_of_its_own():
    one = docs("worker-build.yaml", TAG="r1", BUILD="aaaa11112222")
    two = docs("worker-build.yaml", TAG="r2", BUILD="bbbb33334444")
    (a,) = by_kind(one, "Deployment")
    (b,) = by_kind(two, "Deployment")
    # two builds side by side: different objects, selectors that do not overlap
    assert a["metadata"]["name"] == "artemis-worker-aaaa11112222"
    assert b["metadata"]["name"] == "artemis-worker-bbbb33334444"
    for d, build, tag in ((a, "aaaa11112222", "r1"), (b, "bbbb33334444", "r2")):
        labels = d["spec"]["selector"]["matchLabels"]
        assert labels["artemis/build"] == build
        assert d["spec"]["template"]["metadata"]["labels"] == labels
        c = container(d)
        assert c["image"] == f"artemis:{tag}"
        assert c["args"] == ["artemis", "worker"]
        # a stopping worker finishes its activities before Kubernetes kills it
        grace = d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > WorkerSettings().graceful_shutdown_s


def test_the_shared_part_migrates_first_and_its_config_loads():
    items = docs("artemis.yaml", TAG="r2")
    (job,) = by_kind(items, "Job")
    assert job["metadata"]["name"] == "artemis-db-upgrade-r2"  # one Job per release
    assert container(job)["args"] == ["artemis", "db", "upgrade"]
    (api,) = by_kind(items, "Deployment")
    assert container(api)["image"] == "artemis:r2"
    assert not [d for d in items if "worker" in d["metadata"]["name"]]
    (config,) = by_kind(items, "ConfigMap")
    settings = Settings.model_validate(yaml.safe_load(config["data"]["config.yaml"]))
    assert "." not in (settings.temporal.deployment_name or settings.temporal.task_queue)


def test_the_rollout_steps_name_commands_that_exist():
    text = (K8S / "worker-build.yaml").read_text(encoding="utf-8")
    from typer.main import get_command

    from starter.cli import app

    builds = get_command(app).commands["builds"].commands  # type: ignore[attr-defined]
    named = set(re.findall(r"artemis builds (\w+)", text))
    assert named == {"id", "promote", "list"} and named <= builds.keys()
