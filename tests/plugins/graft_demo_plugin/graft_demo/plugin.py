"""Implements every Graft hook in the simplest observable way and records each call in CALLS."""

from __future__ import annotations

from dataclasses import dataclass, field

from graft import hookimpl

CALLS: list[tuple] = []


@dataclass
class DemoConfig:
    greeting: str = "hello"
    scale: float = 1.0
    tags: list[str] = field(default_factory=list)


@hookimpl
def graft_config_sections():
    return [("demo", DemoConfig)]


def tiny_qwen2(**overrides):
    from transformers import AutoConfig

    fields = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, vocab_size=128, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return AutoConfig.for_model("qwen2", **{**fields, **overrides})


@hookimpl
def graft_model_families():
    from graft.models import ModelFamily

    CALLS.append(("model_families",))
    return [ModelFamily("qwen2", presets={"demo-qwen2": tiny_qwen2})]


@hookimpl
def graft_pre_shard(model, cfg):
    from torch.distributed.fsdp import FSDPModule

    CALLS.append(("pre_shard", type(model).__name__, isinstance(model, FSDPModule)))
    model.graft_demo_greeting = cfg.features.demo.greeting


@hookimpl
def graft_prepare_inputs(batch, pad_size, layout):
    CALLS.append(("prepare_inputs", pad_size, tuple(batch["input_ids"].shape), layout.num_samples))
    flags = batch.get("demo_flags")
    if flags is not None and pad_size:
        import torch

        batch["demo_flags"] = torch.cat([flags, flags.new_zeros((*flags.shape[:-1], pad_size))], -1)


@hookimpl
def graft_step_begin(step):
    CALLS.append(("step_begin", step))


@hookimpl
def graft_step_end(step, metrics):
    CALLS.append(("step_end", step))
    metrics["demo/steps_seen"] = float(sum(1 for c in CALLS if c[0] == "step_end"))


@hookimpl
def graft_loss_agg_modes():
    return ["demo-max"]


def negated_ppo(*, logp, old_logp, advantages, mask, cfg):
    """A toy objective: plain policy gradient, -A * logp."""
    return -advantages * logp, {"demo_logp": logp.detach()}


@hookimpl
def graft_policy_losses():
    return {"demo-pg": negated_ppo}


@hookimpl
def graft_loss_aggregate(loss_mat, loss_mask, mode):
    if mode != "demo-max":
        return None
    CALLS.append(("loss_aggregate", mode))
    return (loss_mat * loss_mask).max()


@hookimpl
def graft_ckpt_load(state, ctx):
    CALLS.append(("ckpt_load", sorted(state)))
    state.setdefault("demo_seen", True)


@hookimpl
def graft_export_slots(name, tensor):
    if not name.endswith("demo_fused.weight"):
        return None
    CALLS.append(("export_slots", name))
    first, second = tensor.chunk(2, dim=0)
    base = name.removesuffix("demo_fused.weight")
    return [(base + "demo_a.weight", first), (base + "demo_b.weight", second)]


@hookimpl
def graft_post_forward(batch, layout, phase):
    CALLS.append(("post_forward", phase, layout.num_samples))


def raw_rewards(rewards):
    """A toy estimator: the reward itself is the advantage."""
    return rewards


@hookimpl
def graft_advantage_estimators():
    return {"demo-raw": raw_rewards}


class EchoRollout:
    """A toy engine: answers each prompt with the prompt's last token, reports no log-probs."""

    kind = "demo-echo"
    model = None
    llm = None

    def request_extras(self, *names):
        from graft.rollout import refuse_extras

        refuse_extras(self.kind, names)

    def generate(self, prompts, spec):
        from graft.rollout import RolloutSample

        return [RolloutSample(list(p), [p[-1]], None) for p in prompts]

    def sync_weights(self):
        return {}

    def close(self):
        pass


@hookimpl
def graft_rollout_engines():
    return {"demo-echo": lambda: EchoRollout()}


class IdleJob:
    """A toy trainer mode: steps that train nothing."""

    def attach(self, engine, run_dir):
        pass

    def step(self, engine):
        CALLS.append(("idle_step",))
        return {"loss": 0.0, "tokens": 0}

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def close(self):
        pass


@hookimpl
def graft_trainer_modes():
    return {"demo-idle": lambda: IdleJob()}
