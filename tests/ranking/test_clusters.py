"""recommend across machines: clusters of 8-GPU machines joined by a fabric, priced as that
many machines, timed and sized as predict and fit answer for that many GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import whichgpu.api as wg
from tests.conftest import run_cli
from whichgpu.catalog import load_catalog
from whichgpu.cost.pricing import cloud_price
from whichgpu.errors import UsageError

ASK = {"seq_len": 2048, "sharding": "fsdp"}
"""A small language model's training, fast to size: its profile is stored."""


def test_renting_16_gpus_prices_two_8_gpu_machines_at_the_speed_predict_gives(
    tmp_path: Path,
) -> None:
    store = tmp_path / "none.sqlite"
    ranking = wg.recommend(
        "llama-3.2-1b",
        acquire="rent",
        gpu_count=16,
        gpus=["h100-sxm"],
        tokens=1e9,
        store=store,
        network="ib-hdr",
        **ASK,
    )
    (top,) = ranking.ranking
    assert (top.count, top.machines, top.network) == (16, 2, "ib-hdr")
    assert top.label() == f"16 x {top.gpu_name} (2 machines)"  # the table's GPU column
    machine = cloud_price(load_catalog(), load_catalog().get("h100-sxm"), gpus=8)
    assert top.hourly_usd == pytest.approx(machine.usd * 8 * 2)
    assert top.price_note.startswith("2 machines of 8: 16 x ")
    # the cluster's throughput: 16 x what predict gives each of 16 GPUs over that fabric
    (speed,) = wg.predict(
        "llama-3.2-1b", gpus=["h100-sxm"], gpu_count=16, network="ib-hdr", store=store, **ASK
    )
    assert speed.n_gpus == 16 and "ib-hdr" in (speed.link or "")
    assert speed.throughput is not None
    per_gpu = speed.throughput / speed.n_gpus
    assert top.throughput == pytest.approx(16 * per_gpu)
    # memory: fit per GPU of the 16, sharded
    (memory,) = wg.fit("llama-3.2-1b", gpus=["h100-sxm"], gpu_count=16, **ASK)
    assert top.max_batch_size == memory.max_batch_size
    # the answer names the machines and the fabric; the assumptions say what renting assumes
    assert ranking.answer.startswith(
        "Rent 2 machines of 8 x H100 SXM (16 GPUs) joined by InfiniBand HDR"
    )
    assert any(r.startswith("a cluster of 2 machines of 8") for r in top.reasons)
    (cluster,) = [a for a in ranking.assumptions if a.startswith("clusters: ")]
    assert "ib-hdr" in cluster and "which clouds join their machines" in cluster


def test_buying_16_gpus_prices_two_8_gpu_servers_and_their_electricity() -> None:
    ask = {"acquire": "buy", "gpus": ["h100-sxm"], "tokens": 1e9, **ASK}
    (one,) = wg.recommend("llama-3.2-1b", gpu_count=8, **ask).ranking
    ranking = wg.recommend("llama-3.2-1b", gpu_count=16, **ask)
    (two,) = ranking.ranking
    assert two.machines == 2 and two.network == "ib-ndr"  # the default fabric
    assert one.purchase_usd is not None and two.purchase_usd is not None
    assert two.purchase_usd == pytest.approx(2 * one.purchase_usd)
    assert "+ 2 x $" in two.price_note and "server base system" in two.price_note
    # electricity: two machines' power for the cluster's time
    assert one.energy_kwh and two.energy_kwh and one.time_s and two.time_s
    assert two.energy_kwh / two.time_s == pytest.approx(2 * one.energy_kwh / one.time_s)
    assert two.cost_usd == pytest.approx(two.purchase_usd + (two.electricity_usd or 0.0))
    (cluster,) = [a for a in ranking.assumptions if a.startswith("clusters: ")]
    assert "switches, cables and network cards are not priced" in cluster


def test_an_sxm_module_is_said_to_need_a_server_on_one_machine_and_gpus_alone_price() -> None:
    """The module's caveat joins a bought machine of 8 as a cluster's; pricing the GPUs alone
    (no machine, so no caveat) works for a cluster too."""
    for count in (8, 16):
        ranking = wg.recommend(
            "llama-3.2-1b", acquire="buy", gpu_count=count, gpus=["h100-sxm"], **ASK
        )
        (top,) = ranking.ranking
        assert any("SXM module: it needs a GPU server's baseboard" in r for r in top.reasons)
    alone = wg.recommend(
        "llama-3.2-1b", acquire="buy", gpu_only=True, gpu_count=16, gpus=["h100-sxm"], **ASK
    )
    (top,) = alone.ranking
    assert top.machines == 2 and not any("SXM module" in r for r in top.reasons)


def test_counts_a_cluster_cannot_be_made_of_and_serving_across_machines_are_refused() -> None:
    with pytest.raises(UsageError, match="nodes of 8, and 8 does not divide 12"):
        wg.recommend("llama-3.2-1b", gpu_count=12, gpus=["h100-sxm"])
    for count in (16, "1-16"):
        with pytest.raises(UsageError, match="within one node only"):
            wg.recommend("llama-3.2-1b", mode="inference", gpu_count=count, gpus=["h100-sxm"])
    with pytest.raises(UsageError, match="not a known fabric"):
        wg.recommend("llama-3.2-1b", gpu_count=16, network="token-ring", gpus=["h100-sxm"])


def test_a_range_goes_on_in_clusters_and_auto_only_when_one_machine_misses_the_deadline() -> None:
    ask = {"acquire": "rent", "gpus": ["h100-sxm"], "tokens": 1e11, **ASK}
    ranged = wg.recommend("llama-3.2-1b", gpu_count="8-32", **ask)
    assert {c.count: c.machines for c in ranged.ranking} == {8: 1, 16: 2, 32: 4}
    # in time on one machine: auto stays there
    relaxed = wg.recommend("llama-3.2-1b", gpu_count="auto", within_hours=400, **ask)
    assert {c.count for c in relaxed.ranking} <= {1, 2, 4, 8} and relaxed.ranking
    assert not any(n.startswith("--gpus auto") for n in relaxed.assumptions)
    # not in time on one machine of 8: auto ranks clusters and says so
    rushed = wg.recommend("llama-3.2-1b", gpu_count="auto", within_hours=48, **ask)
    assert rushed.ranking and all(c.machines > 1 for c in rushed.ranking)
    assert {e.count for e in rushed.excluded if e.kind == "time"} >= {1, 2, 4, 8}
    (why,) = [n for n in rushed.assumptions if n.startswith("--gpus auto")]
    assert "no machine of 1 to 8 GPUs finishes the job within 48 h" in why


def test_the_cli_names_the_machines_and_the_fabric_in_its_json() -> None:
    result = run_cli(
        "recommend",
        "llama-3.2-1b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "16",
        "--network",
        "ib-hdr",
        "--rent",
        "--seq-len",
        "2048",
        "--sharding",
        "fsdp",
        "--tokens",
        "1e9",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    (row,) = doc["ranking"]
    assert (row["count"], row["machines"], row["network"]) == (16, 2, "ib-hdr")
    assert "2 machines of 8" in doc["answer"] and "InfiniBand HDR" in doc["answer"]
    assert doc["run"]["network"] == "ib-hdr"
    assert any("ib-hdr" in a and a.startswith("clusters: ") for a in doc["assumptions"])


def test_auto_goes_on_to_clusters_when_a_sharded_state_does_not_fit_one_machine() -> None:
    """Where nothing ranks on one machine because the model state does not fit, auto goes on
    to clusters when the run shards that state (each GPU more holds less) and says why; under
    DDP more GPUs hold no less, and it stays. (Llama 3.1 70B under FSDP on H100s with
    checkpointing: 8 GPUs need 182 GiB a GPU, 32 fit; docs/recommend.md.)"""
    from types import SimpleNamespace

    from whichgpu.api.recommend import _cluster_note, _needs_a_cluster
    from whichgpu.schema import Exclusion

    ranked = wg.recommend("llama-3.2-1b", gpu_count=8, gpus=["h100-sxm"], acquire="rent", **ASK)
    out = [
        Exclusion(gpu="h100-sxm", gpu_name="H100 SXM", count=n, kind="memory", reason="")
        for n in (1, 2, 4, 8)
    ]
    nothing = ranked.model_copy(update={"ranking": (), "excluded": tuple(out)})
    auto = SimpleNamespace(gpu_count="auto", question=SimpleNamespace(within_hours=None))
    assert _needs_a_cluster(auto, nothing, None)  # type: ignore[arg-type]
    why = _cluster_note(auto, nothing, None)  # type: ignore[arg-type]
    assert "no machine of 1 to 8 GPUs holds the model state sharded over it (fsdp)" in why
    whole = nothing.model_copy(update={"run": nothing.run.model_copy(update={"sharding": "ddp"})})
    assert not _needs_a_cluster(auto, whole, None)  # type: ignore[arg-type]
    counted = SimpleNamespace(gpu_count=8, question=auto.question)
    assert not _needs_a_cluster(counted, nothing, None)  # type: ignore[arg-type]
    assert not _needs_a_cluster(auto, ranked, None)  # type: ignore[arg-type]
