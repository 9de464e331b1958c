"""The static decode's plain copy of the policy: refreshed from the trained model after every
update, then handed to plugins (``graft_inference_copy``) so that it computes what the policy
computes, whatever ``graft_pre_shard`` changed on the trained model."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from graft import hookimpl
from graft.config import compose
from graft.training.trainer import Trainer

# A static-decode RL run on CPU that saves and exports nothing.
STATIC = ("engine.device=cpu", "rollout.decode=static", "checkpoint.every_steps=0",
          "checkpoint.save_at_end=false", "export.hf_at_end=false")


def halve_logits(model: torch.nn.Module) -> None:
    """A forward change a plugin makes: the model's logits halved (a temperature baked in)."""
    model.lm_head.register_forward_hook(lambda module, args, out: out * 0.5)
    model._halved = True


class HalvedPolicy:
    """Halves the trained policy's logits in ``graft_pre_shard`` and, in
    ``graft_inference_copy``, the decode copy's (once), recording what each call saw."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    @hookimpl
    def graft_pre_shard(self, model, role):
        if role == "policy":
            halve_logits(model)

    @hookimpl
    def graft_inference_copy(self, model, trained, cfg):
        weight = model.get_input_embeddings().weight
        trained_weight = trained.get_input_embeddings().weight.full_tensor()
        self.calls.append({"model": model, "trained": trained, "cfg": cfg,
                           "weights_in": torch.equal(weight, trained_weight.to(weight.dtype))})
        if not getattr(model, "_halved", False):
            halve_logits(model)


def test_hook_graft_inference_copy_runs_after_every_refresh_and_the_copy_samples_its_changes(
        tmp_path: Path, graft_plugin) -> None:
    plugin = HalvedPolicy()
    graft_plugin(plugin, name="halved")
    cfg = compose([f"trainer.run_dir={tmp_path}", *STATIC, "trainer.total_steps=2",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                   "algorithm.old_logprobs=always"])
    trainer = Trainer(cfg)
    copy = trainer.job.rollout.copy.model
    rows = trainer.fit()
    # built (first refresh), then refreshed after each of the 2 updates: always the same copy,
    # holding the trained weights as they were then
    assert [call["model"] for call in plugin.calls] == [copy] * 3
    assert all(call["trained"] is trainer.engine.model for call in plugin.calls)
    assert all(call["weights_in"] for call in plugin.calls)
    assert all(call["cfg"].trainer.run_dir == cfg.trainer.run_dir  # the run's config, resolved
               and call["cfg"].rollout.decode == "static" for call in plugin.calls)
    # the copy sampled the halved policy the trainer scores (unhalved: ~1e-1 per token)
    assert all(row["train_infer_logprob_diff"] < 1e-5 for row in rows), rows


class FrozenEmbeddings:
    """Freezes the policy's input embeddings before sharding (as an adapter plugin freezes the
    base)."""

    @hookimpl
    def graft_pre_shard(self, model, role):
        if role == "policy":
            model.get_input_embeddings().weight.requires_grad_(False)


def test_a_refresh_copies_parameters_that_do_not_train_only_the_first_time(
        tmp_path: Path, graft_plugin) -> None:
    graft_plugin(FrozenEmbeddings(), name="frozen")
    cfg = compose([f"trainer.run_dir={tmp_path}", *STATIC, "trainer.total_steps=2",
                   "rollout.prompts_per_step=4", "rollout.n=4", "rollout.max_new_tokens=8",
                   "algorithm.reward=positional_match"])
    trainer = Trainer(cfg)
    copy, trained = trainer.job.rollout.copy, trainer.engine.model
    before = {name: value.clone() for name, value in copy.model.state_dict().items()}
    trainer.fit()
    trained_state = {name: value.full_tensor() for name, value in trained.state_dict().items()}
    changed = [name for name, value in copy.model.state_dict().items()
               if not torch.equal(value, before[name])]
    assert changed and "model.embed_tokens.weight" not in changed  # the updates trained
    for name, value in copy.model.state_dict().items():  # after 2 updates: what trains now
        assert torch.equal(value, trained_state[name]), name
    frozen = copy.model.get_input_embeddings().weight
    trains = copy.model.model.layers[0].self_attn.o_proj.weight
    with torch.no_grad():
        frozen.add_(1.0)
        trains.add_(1.0)
    copy.refresh()
    assert torch.equal(trains, trained_state["model.layers.0.self_attn.o_proj.weight"])
    assert torch.equal(frozen, trained_state["model.embed_tokens.weight"] + 1.0)


def test_the_copy_of_a_model_with_tied_embeddings_keeps_them_tied(tmp_path: Path) -> None:
    """A saved model whose output layer is its input embedding (``tie_word_embeddings``, as
    Qwen3's small models and Gemma 3 are): the export names the shared tensor once, so the
    copy's output layer must be its embedding, or it samples from uninitialised memory."""
    from graft.testing import write_chat_checkpoint

    folder = write_chat_checkpoint(tmp_path / "tied")
    cfg = compose([f"model.path={folder}", f"trainer.run_dir={tmp_path / 'run'}", *STATIC])
    trainer = Trainer(cfg)
    copy, trained = trainer.job.rollout.copy.model, trainer.engine.model
    assert copy.config.tie_word_embeddings
    assert copy.lm_head.weight is copy.get_input_embeddings().weight
    ids = torch.arange(1, 13).view(2, 6)
    with torch.no_grad():
        assert torch.allclose(copy(ids).logits, trained(ids).logits, atol=1e-5)


class ScaledOutput:
    """An adapter plugin in miniature: the policy's base frozen except its output layer, and
    the adapter, its learnt scale of the logits, applied by the copy itself (``install``)."""

    def __init__(self, *, required: bool) -> None:
        self.required = required
        self.installs: list[torch.nn.Module] = []
        self.base_only_entries: list[bool] = []
        self.inside = False
        self.rank, self.targets, self.fallback = 1, ["lm_head"], "features.scaled.sync=merged"

    @hookimpl
    def graft_pre_shard(self, model, role):
        if role == "policy":
            model.requires_grad_(False)
            model.lm_head.weight.requires_grad_(True)

    @hookimpl
    def graft_rollout_adapter(self, model, cfg):
        return self

    @hookimpl
    def graft_export_entries(self, model, entries):
        self.base_only_entries.append(self.inside)
        return None

    @contextmanager
    def base_only(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def write(self, out_dir, *, is_main):
        raise AssertionError("the embedded copy installs adapters, it writes none")

    def install(self, model):
        self.installs.append(model)


def test_a_required_adapter_shares_the_frozen_base_and_installs_itself_after_every_refresh(
        tmp_path: Path, graft_plugin) -> None:
    adapter = ScaledOutput(required=True)
    graft_plugin(adapter, name="scaled")
    cfg = compose([f"trainer.run_dir={tmp_path}", *STATIC, "trainer.total_steps=2",
                   "rollout.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
                   "model.preset=tiny-llama"])
    trainer = Trainer(cfg)
    copy, trained = trainer.job.rollout.copy.model, trainer.engine.model
    trainer.fit()
    assert adapter.installs == [copy] * 3  # built, then after each update
    assert all(adapter.base_only_entries)  # every export the copy took: the base, not merged
    local = {name: value.to_local() for name, value in trained.state_dict().items()}
    for name, value in copy.state_dict().items():
        # a frozen tensor is the trainer's own (one rank: whole already); what trains, a copy
        same = value.data_ptr() == local[name].data_ptr()
        assert same == (name != "lm_head.weight"), name
        assert torch.equal(value, local[name]), name


def test_an_adapter_that_is_not_required_leaves_the_copy_merged_weights_of_its_own(
        tmp_path: Path, graft_plugin) -> None:
    adapter = ScaledOutput(required=False)
    graft_plugin(adapter, name="scaled")
    cfg = compose([f"trainer.run_dir={tmp_path}", *STATIC, "model.preset=tiny-llama"])
    trainer = Trainer(cfg)
    copy, trained = trainer.job.rollout.copy.model, trainer.engine.model
    local = {name: value.to_local() for name, value in trained.state_dict().items()}
    assert not adapter.installs and not any(adapter.base_only_entries)
    assert all(value.data_ptr() != local[name].data_ptr()
               for name, value in copy.state_dict().items())
