"""The workload registry, run configurations, and parameter counts against published ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from whichgpu.errors import UnknownWorkload, UnsupportedWorkload, UsageError
from whichgpu.schema import RunConfig
from whichgpu.workloads import (
    all_workloads,
    check_for_workload,
    get_workload,
    run_config,
    select_workload,
)
from whichgpu.workloads.user import config_workload, read_user_config

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONFIGS = Path(__file__).parents[2] / "src" / "whichgpu" / "workloads" / "configs"


@pytest.mark.parametrize(
    ("typed", "slug"),
    [
        ("ResNet-50", "resnet50"),
        ("llama3.1-8b", "llama-3.1-8b"),
        ("GPT2-XL", "gpt2-xl"),
        ("vit_b_16", "vit-b-16"),
    ],
)
def test_near_misses_resolve(typed: str, slug: str) -> None:
    assert get_workload(typed).info.name == slug


def test_unknown_workload_suggests() -> None:
    with pytest.raises(UnknownWorkload) as err:
        get_workload("llama-3.1-9b")
    assert "llama-3.1-8b" in err.value.suggestions


def test_listing_does_not_import_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None; "
        "from whichgpu.workloads import all_workloads; print(len(all_workloads()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 17


def test_every_workload_is_documented() -> None:
    for w in all_workloads():
        info = w.info
        assert info.description and info.task and info.params_source and info.reference
        assert info.is_sequence_model == (info.default_seq_len is not None)


# Parameter counts must equal the published ones exactly for transformers-built models: the
# figures are those of each model card's reference config (sources in each WorkloadInfo).
@pytest.mark.parametrize(
    "name", [w.info.name for w in all_workloads() if w.info.family in ("llm", "encoders", "vision")]
)
def test_parameter_count_matches_published(name: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    workload = get_workload(name)
    with FakeTensorMode():
        model = workload.build(RunConfig()).model
        count = sum(p.numel() for p in model.parameters())
    assert count == workload.info.params_published


def test_bf16_pure_builds_bf16_weights() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = get_workload("gpt2").build(RunConfig(precision="bf16-pure")).model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"precision": "fp12"}, "precision"),
        ({"context": 100}, "mode inference only"),
        ({"mode": "inference", "method": "lora"}, "use mode train"),
        ({"lora_targets": "q_proj"}, "method lora or qlora"),
        ({"lora_rank": 8}, "lora_rank needs method lora or qlora"),
        ({"mode": "inference", "optimizer": "sgd"}, "inference has no optimizer"),
    ],
)
def test_run_options_that_cannot_work_together(options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        run_config(**options)


def test_lora_targets_are_split() -> None:
    run = run_config(method="lora", lora_targets="q_proj, v_proj")
    assert run.lora_targets == ("q_proj", "v_proj")


def test_a_run_describes_what_differs_from_a_plain_one() -> None:
    assert RunConfig().describe() == "train, bf16, adamw"
    qlora = RunConfig(method="qlora", checkpointing=True, lora_rank=8)
    assert qlora.describe(2048) == (
        "train, bf16, adamw, qlora rank 8, gradient checkpointing, sequence length 2048"
    )
    served = RunConfig(mode="inference", context=4096, new_tokens=128, optimizer="sgd")
    assert served.describe() == "inference, bf16, context 4096 + 128 new tokens"


def test_seq_len_does_not_apply_to_images() -> None:
    with pytest.raises(UnsupportedWorkload, match="seq_len does not apply"):
        check_for_workload(RunConfig(seq_len=128), get_workload("resnet50").info)


def test_user_config(tmp_path: Path) -> None:
    workload = config_workload(FIXTURES / "tiny-llama.json")
    assert workload.info.task == "causal-lm" and workload.info.throughput_unit == "tokens"
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 3}')
    with pytest.raises(UsageError, match="model_type"):
        config_workload(bad)
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        config_workload(bad)
    bad.write_bytes(bytes(range(128, 256)))
    with pytest.raises(UsageError, match="not UTF-8 text"):
        config_workload(bad)
    with pytest.raises(UsageError, match="--task: 'nosuch' is not one of"):
        select_workload(None, FIXTURES / "tiny-llama.json", "nosuch")  # type: ignore[arg-type]


def test_older_class_names_and_task_switches(tmp_path: Path) -> None:
    # GPT-2's own config.json names GPT2LMHeadModel, which has no ...ForCausalLM twin.
    gpt2 = tmp_path / "gpt2.json"
    gpt2.write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 8})
    )
    config, task = read_user_config(gpt2)
    assert task == "causal-lm" and config["architectures"] == ["GPT2LMHeadModel"]
    config, task = read_user_config(gpt2, "causal-lm")
    assert config["architectures"] == ["GPT2LMHeadModel"]
    config, _ = read_user_config(gpt2, "seq-cls")
    assert config["architectures"] == ["GPT2ForSequenceClassification"]
    llama = FIXTURES / "tiny-llama.json"
    config, _ = read_user_config(llama, "seq-cls")
    assert config["architectures"] == ["LlamaForSequenceClassification"]
    nameless = tmp_path / "nameless.json"
    nameless.write_text('{"model_type": "llama", "vocab_size": 8}')
    with pytest.raises(UsageError, match="names no 'architectures'"):
        read_user_config(nameless, "causal-lm")
    odd = tmp_path / "odd.json"
    odd.write_text('{"model_type": "t5", "architectures": ["T5Model"], "vocab_size": 8}')
    with pytest.raises(UnsupportedWorkload, match="pass --task"):
        read_user_config(odd)
    # BERT's own config names BertForPreTraining: masked LM (with its next-sentence head)
    config, task = read_user_config(CONFIGS / "bert-large.json")
    assert task == "masked-lm" and config["architectures"] == ["BertForPreTraining"]
    # other heads and the base model switch to the family's class for the task
    for head in ("BertForQuestionAnswering", "BertModel"):
        bert = tmp_path / f"{head}.json"
        bert.write_text(json.dumps({"model_type": "bert", "architectures": [head]}))
        config, _ = read_user_config(bert, "masked-lm")
        assert config["architectures"] == ["BertForMaskedLM"], head
    config, _ = read_user_config(gpt2, "causal-lm")
    assert config["architectures"] == ["GPT2LMHeadModel"]  # not 'GPT2ForCausalLM'


def test_a_bert_pretraining_config_trains_with_both_heads(tmp_path: Path) -> None:
    tiny = {
        "model_type": "bert", "architectures": ["BertForPreTraining"], "vocab_size": 64,
        "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 32, "max_position_embeddings": 64,
    }  # fmt: skip
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(tiny))
    workload = config_workload(path)
    built = workload.build(RunConfig(precision="fp32"))
    batch = built.make_batch(2, 8)
    assert set(batch) == {"input_ids", "labels", "next_sentence_label"}
    loss = built.loss(built.model, batch)
    assert loss.ndim == 0 and float(loss.detach()) > 0


def _bert_params(vocab: int, width: int, layers: int, pooler: bool) -> int:
    """Parameters of a BERT encoder (Devlin et al. 2019): token, position (512) and segment (2)
    embeddings with a LayerNorm; per layer Q, K, V, output projections, a 4x MLP and two
    LayerNorms; the pooler is one dense layer."""
    embeddings = (vocab + 512 + 2) * width + 2 * width
    layer = 4 * (width * width + width) + 2 * (4 * width * width) + 4 * width + width + 4 * width
    return embeddings + layers * layer + (width * width + width if pooler else 0)


def test_bert_squad_and_mt_dnn_parameter_counts() -> None:
    # BERT-Base with a span head (start/end logit per token, 768 -> 2), no pooler.
    squad = get_workload("bert-squad").info
    assert squad.params_published == _bert_params(30522, 768, 12, pooler=False) + 768 * 2 + 2
    assert squad.params_published == 108_893_186
    assert (squad.default_batch_size, squad.default_seq_len) == (12, 384)
    # BERT-Large with its pooler and 8 linear GLUE heads: 15 outputs (MNLI 3, STS-B 1, QNLI 1,
    # five binary classifiers).
    mt_dnn = get_workload("mt-dnn").info
    assert mt_dnn.params_published == _bert_params(30522, 1024, 24, pooler=True) + 1024 * 15 + 15
    assert mt_dnn.params_published == 335_157_263
    assert (mt_dnn.default_seq_len, mt_dnn.throughput_unit) == (512, "sequences")


def test_mt_dnn_step_trains_the_mnli_head_only() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        built = get_workload("mt-dnn").build(RunConfig())
        batch = built.make_batch(2, 32)
        built.loss(built.model, batch).backward()  # type: ignore[no-untyped-call]
        heads = built.model.get_submodule("heads").named_children()
        trained = [name for name, head in heads if head.get_parameter("weight").grad is not None]
        assert trained == ["mnli"]
        embedding = built.model.get_submodule("bert.embeddings.word_embeddings")
        assert embedding.get_parameter("weight").grad is not None
        assert batch["labels"].dtype == torch.int64


def _tiny_mixtral(tmp_path: Path) -> Path:
    config = {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 512,
    }
    path = tmp_path / "tiny-mixtral.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("precision", ["bf16", "fp16", "bf16-pure"])
def test_mixtral_experts_trace_under_amp(tmp_path: Path, precision: str) -> None:
    # transformers' grouped_mm experts: torch._grouped_mm is not on autocast's list and its
    # fake kernel takes bf16 only; under AMP the trace autocasts it to bf16 (fp32 master weights
    # and gradients stay fp32), and the profile says so.
    from whichgpu.trace import trace_step
    from whichgpu.workloads.hf import (
        GROUPED_EXPERTS_AMP_TRANSFORMERS,
        _release,
        transformers_version,
    )

    workload = config_workload(_tiny_mixtral(tmp_path))
    run = RunConfig.model_validate({"batch_size": 2, "seq_len": 32, "precision": precision})
    installed = _release(transformers_version())
    if precision != "bf16-pure" and installed < _release(GROUPED_EXPERTS_AMP_TRANSFORMERS):
        # older transformers hand the op fp32 operands under AMP: refused, with the fix
        with pytest.raises(UnsupportedWorkload, match=r"needs transformers >= 5\.24"):
            trace_step(workload, run)
        return
    profile = trace_step(workload, run)
    grouped = [op for op in profile.ops if op.name == "aten._grouped_mm"]
    assert grouped and {op.dtype for op in grouped} == {"bfloat16"}
    assert {op.phase for op in grouped} == {"forward", "backward"}
    expected = "autocast to bf16" if precision != "bf16-pure" else "grouped_mm"
    assert expected in profile.choices["moe_experts"]
    assert "moe_experts" not in trace_step(get_workload("gpt2"), RunConfig(seq_len=16)).choices


def test_mixtral_fp32_trace_is_refused_with_the_reason(tmp_path: Path) -> None:
    from whichgpu.trace import trace_step

    with pytest.raises(UnsupportedWorkload, match=r"_grouped_mm.*bf16 only"):
        trace_step(config_workload(_tiny_mixtral(tmp_path)), RunConfig(precision="fp32"))


def test_release_reads_the_numeric_part_of_a_version() -> None:
    from whichgpu.workloads.hf import _release

    assert _release("5.24.0") == (5, 24, 0)
    assert _release("5.17.0.dev0") == (5, 17, 0)
    assert _release("5.3.0rc1") == (5, 3, 0)
    assert _release("5.17.0") < _release("5.24.0") < _release("5.100.1")


@pytest.mark.parametrize(
    ("options", "field", "api", "cli"),
    [
        ({"batch_size": -1}, "batch_size", "batch_size must be at least 1", "--batch-size"),
        ({"gpus": 0}, "gpu_count", "gpu_count must be at least 1", "--gpus must be"),
        ({"precision": "fp12"}, "precision", "precision: ", "--precision: "),
        ({"mode": "inference", "checkpointing": True}, "checkpointing", "checkpointing saves",
         "--checkpointing saves"),
    ],
)  # fmt: skip
def test_an_api_error_names_the_keyword_and_the_cli_the_flag(
    options: dict[str, object], field: str, api: str, cli: str
) -> None:
    from whichgpu.cli.output import error_message

    with pytest.raises(UsageError) as caught:
        run_config(**options)
    assert caught.value.field == field
    assert str(caught.value).startswith(api) and "--" not in str(caught.value)
    assert cli in error_message(caught.value)


def test_the_api_and_the_cli_name_a_bad_batch_size_each_their_way(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    import whichgpu
    from whichgpu.cli import main

    with pytest.raises(UsageError, match=r"^batch_size must be at least 1, not -1\.$") as caught:
        whichgpu.fit("resnet50", gpus=["4090"], batch_size=-1)
    assert caught.value.field == "batch_size"
    assert main(["fit", "resnet50", "-g", "4090", "--batch-size", "-1", "--json"]) == 2
    out = capsys.readouterr()
    assert "error: --batch-size must be at least 1, not -1." in out.err
    error = json.loads(out.out)["error"]
    assert error["field"] == "batch_size" and error["message"].startswith("--batch-size")


def test_a_keyword_that_is_no_run_option_is_named_with_the_nearest_one() -> None:
    import whichgpu

    with pytest.raises(
        UsageError, match=r"^batchsize is not an option of a run\. Did you mean batch_size\?"
    ):
        whichgpu.fit("resnet50", gpus=["4090"], batchsize=4)
    with pytest.raises(UsageError, match=r"^budget is not an option of a run\. The run"):
        whichgpu.recommend("resnet50", budget=500)  # recommend's own keyword is budget_usd
