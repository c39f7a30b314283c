"""Instances: one session per MNEMO_PROVIDER entry for every model, listed by GET /models, counted per instance
in /metrics, checked at startup and in the settings."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from app.core.settings import Settings, usable_cpus
from app.runtime.sessions import ProviderUnavailable
from tests.helpers import app_client
from tests.toy_model import toy_body

CPU = "CPUExecutionProvider"


def test_each_provider_listed_gives_every_model_an_instance_listed_and_counted(toy_artifacts):
    with app_client(toy_artifacts, toy=True, provider="cpu, cpu") as client:
        models = client.get("/models").json()["models"]
        for _ in range(5):
            assert client.post("/toy", json=toy_body()).status_code == 200
        metrics = client.get("/metrics").text
    for model in models:
        assert [(i["name"], i["provider"]) for i in model["instances"]] == [("cpu-0", CPU), ("cpu-1", CPU)]
        assert all(set(i["cost"]) == {"fixed_ms", "per_step_us", "per_cell_us"} for i in model["instances"])
        assert model["instances"][0]["cost"]["fixed_ms"] + model["instances"][0]["cost"]["per_cell_us"] > 0  # seeded
    toy = next(model["name"] for model in models if model["default"])
    runs = re.findall(rf'mnemo_instance_runs_total{{model="{toy}",model_instance="(cpu-\d)"}} (\S+)', metrics)
    rows = re.findall(rf'mnemo_instance_rows_total{{model="{toy}",model_instance="cpu-\d"}} (\S+)', metrics)
    assert sum(float(count) for _, count in runs) == 5 and sum(map(float, rows)) == 5


def test_an_unavailable_provider_in_the_list_stops_startup_naming_it(toy_artifacts):
    with (
        pytest.raises(ProviderUnavailable, match="MNEMO_PROVIDER=cuda asks for CUDAExecutionProvider"),
        app_client(toy_artifacts, toy=True, provider="cpu,cuda"),
    ):
        pass


@pytest.mark.parametrize("provider", ["cpu,gpu", "", " , "])
def test_a_provider_list_with_an_unknown_or_no_entry_is_a_settings_error(provider):
    with pytest.raises(ValidationError, match="is not a provider"):
        Settings(provider=provider)


def test_the_provider_list_is_read_in_any_case_and_spacing():
    assert Settings(provider=" CUDA , cpu").provider == "cuda,cpu"


@pytest.mark.parametrize(("provider", "fits"), [("cuda,cpu", False), ("cpu,cpu", False), ("cuda", True)])
def test_the_cpu_instances_share_the_thread_budget(provider, fits):
    """Every CPU instance runs on the same MNEMO_CONCURRENT_RUNS threads: with any CPU entry they must fit the CPUs."""
    settings = {"provider": provider, "concurrent_runs": usable_cpus() + 1, "intra_op_threads": 1}
    if fits:
        Settings(**settings)
    else:
        with pytest.raises(ValidationError, match=r"exceeds the \d+ CPUs"):
            Settings(**settings)
