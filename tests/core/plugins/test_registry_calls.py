"""One calling convention for every registry: keyword arguments, each function gets only those
it declares; a function the convention cannot call is refused when its plugin registers, naming
the plugin, the entry, the function and the keywords it may take."""

from __future__ import annotations

import dataclasses

import pytest

from graft import hookimpl
from graft.errors import PluginError
from graft.plugins import GraftPluginManager
from graft.plugins.keywords import REGISTRY_CALLS, call_with_keywords, unmet_parameters
from graft.rl import AdvantageEstimator, RewardFunction
from graft.testing import check_plugin


def registry_plugin(hook: str, entries):
    """A plugin whose ``hook`` returns ``entries``."""
    return type("Entries", (), {hook: staticmethod(hookimpl(specname=hook)(lambda: entries))})()


def fresh_manager() -> GraftPluginManager:
    manager = GraftPluginManager()
    manager.load(candidates=[])
    return manager


def text_reward(text, sample):  # "text" is not a reward keyword
    return 1.0


def _family_with(parallelize):
    from graft.models import BUILTIN_FAMILIES

    return [dataclasses.replace(BUILTIN_FAMILIES[0], model_type="toy", parallelize=parallelize)]


@pytest.mark.parametrize(("hook", "entries", "message"), [
    ("graft_reward_functions", {"by-text": text_reward},
     r"plugin 'bad': the reward 'by-text' is text_reward\(text, sample\), which cannot be called: "
     r"Graft calls every reward with keyword arguments only, from response, sample, cfg \(a "
     r"function takes any of them it names\), and nothing fills 'text'"),
    ("graft_reward_functions", {"wrapped": RewardFunction(text_reward)}, r"nothing fills 'text'"),
    ("graft_policy_losses", {"pg": lambda logp, adv: -logp},
     r"the policy loss 'pg' is .*<lambda>\(logp, adv\).* from logp, old_logp, advantages, mask, "
     r"cfg, root_cfg, tensors .*nothing fills 'adv'"),
    ("graft_advantage_estimators", {"raw": AdvantageEstimator(lambda values, /: values)},
     r"the advantage estimator 'raw' .*from rewards, group_size, cfg .*nothing fills 'values'"),
    ("graft_rollout_engines", {"echo": lambda engine_cfg: None},
     r"the rollout engine 'echo' .*from cfg, engine, env, run_dir, tokenizer"),
    ("graft_trainer_modes", {"idle": lambda config: None}, r"the trainer mode 'idle'"),
    ("graft_model_families", _family_with(lambda model, family, /, *, cfg: model),
     r"the model family 'toy' .*from model, family, cfg, mesh, device, role, meshes .*nothing "
     r"fills 'model', 'family'"),
])
def test_an_uncallable_registry_function_is_refused_at_registration(hook, entries,
                                                                    message) -> None:
    manager = fresh_manager()
    with pytest.raises(PluginError, match=message):
        manager.register(registry_plugin(hook, entries), "bad")
    assert "bad" not in manager.records and not manager.pm.has_plugin("bad")
    with pytest.raises(PluginError, match=message):
        check_plugin(registry_plugin(hook, entries), "bad")  # graft.testing's conformance check


def test_signatures_the_convention_can_call_are_accepted() -> None:
    def keyword_only(*, response, sample):
        return 1.0

    def optional_extra(response, sample, scale=2.0, *rest):
        return scale

    def anything(**kwargs):
        return 0.0

    manager = fresh_manager()
    manager.register(registry_plugin("graft_reward_functions", {
        "kw": keyword_only, "extra": optional_extra, "any": anything,
        "nothing": lambda: 0.0}), "good")
    assert manager.records["good"].status == "loaded"


def test_calls_pass_keywords_only_and_only_those_declared() -> None:
    seen = {}

    def reward(*, sample, **others):
        seen.update(others, sample=sample)
        return 1.0

    assert call_with_keywords(reward, response="r", sample="s", cfg=None) == 1.0
    assert seen == {"response": "r", "sample": "s", "cfg": None}
    assert call_with_keywords(lambda response: response, response="r", sample="s") == "r"
    with pytest.raises(TypeError):
        call_with_keywords(lambda response: response, "r")  # no positional arguments


def test_unmet_parameters() -> None:
    keywords = REGISTRY_CALLS["graft_reward_functions"].keywords
    assert unmet_parameters(lambda response, sample: 0, keywords) == []
    assert unmet_parameters(lambda response, /, sample: 0, keywords) == ["response"]
    assert unmet_parameters(lambda text, *args, **kw: 0, keywords) == ["text"]
    assert unmet_parameters(lambda text=None: 0, keywords) == []
