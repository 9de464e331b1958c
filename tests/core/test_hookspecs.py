"""Meta-tests on the hook contract: every spec documented and exercised by a test."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pluggy

from graft import hookspecs
from graft.plugins.validation import hook_specs

TESTS = Path(__file__).resolve().parents[1]


def test_every_hook_spec_has_a_complete_docstring() -> None:
    for name, spec in hook_specs().items():
        doc = inspect.getdoc(spec) or ""
        assert "When:" in doc, f"{name}: the docstring must say when the hook fires"
        assert "rank" in doc, f"{name}: the docstring must say on which ranks it runs"
        assert "mutate" in doc, f"{name}: the docstring must say whether it may mutate arguments"
        assert "firstresult" in doc, f"{name}: the docstring must say whether the first result wins"


def test_firstresult_specs_say_so_and_others_do_not_claim_it() -> None:
    for name, spec in hook_specs().items():
        options = getattr(spec, f"{hookspecs.PROJECT_NAME}_spec")
        doc = inspect.getdoc(spec) or ""
        if options["firstresult"]:
            assert "``firstresult``:" in doc, name
        else:
            assert "Not ``firstresult``" in doc, name


def test_hook_specs_are_the_design_table() -> None:
    assert set(hook_specs()) == {
        "graft_config_sections", "graft_config_rules", "graft_model_families", "graft_pre_shard",
        "graft_prepare_inputs", "graft_loss_aggregate", "graft_export_slots",
        "graft_ckpt_load", "graft_step_begin", "graft_step_end",
        # added for the loss registries (docs/design.md lists them)
        "graft_policy_losses", "graft_loss_agg_modes",
        # added for the RL loop
        "graft_reward_functions", "graft_rollout_begin", "graft_rollout_end",
        # added for the plugins' seams: open registries and the post-forward record
        "graft_advantage_estimators", "graft_rollout_engines", "graft_trainer_modes",
        "graft_post_forward",
        # added so the static decode's copy computes what the policy computes (QAT)
        "graft_inference_copy",
        # added so `auto` settings keep a plugin's needs (R3 decodes with the hooked model)
        "graft_auto_settings",
        # added for multi-turn episodes with an environment plugin's tools (#29)
        "graft_environments",
        # added for sequence parallelism: a plugin sizes the sp mesh dimension (#28)
        "graft_parallel_dims",
        # added so a plugin wraps every forward, backward and decode step (graft-exact, #37)
        "graft_compute",
        # added so the config is a leaf: each package registers the registries its choices
        # name and graft train's pre-flight checks (#37)
        "graft_config_choices", "graft_preflight",
        # added so a plugin supplies the static copy's decode loop (graft-graphed-decode, #37)
        "graft_static_decoder",
        # added so a plugin makes an RL step's samples in place of one generate per prompt
        # (graft-multiturn's episodes, #37)
        "graft_episode_runner",
        # added so a plugin adds an off-policy correction of the policy loss (#38)
        "graft_rollout_corrections",
        # added so a plugin runs the rewards in workers, each sample within a time limit
        # (graft-reward-pool, #37)
        "graft_reward_executor",
        # added so a plugin gives ranks other roles than training and supplies the RL steps'
        # experience from them (graft-async-rl's rollout workers, #38)
        "graft_rank_roles", "graft_role_runner", "graft_experience_source",
        # added so a plugin shapes what each RL step trains on (graft-dapo, #38)
        "graft_batch_shaper",
        # added so a plugin adds trainable parameters to a frozen base and keeps them apart:
        # left out of checkpoints, initialised after a model.path load, merged into exports,
        # written at the run's end (graft-lora, #39)
        "graft_ckpt_save", "graft_weights_loaded", "graft_export_entries", "graft_train_end",
        # added so graft export writes a plugin's own format of a checkpoint (graft-lora's
        # PEFT adapter directory, #39)
        "graft_export_formats",
        # added so a plugin opens what it logs to once per run, knowing the run directory and
        # the step it resumes after (graft-wandb, #41)
        "graft_train_begin",
        # added so a plugin adds a subcommand to the graft command line (graft-plot's
        # `graft plot`, #41)
        "graft_cli_commands",
        # added so an inference engine that loads adapters itself takes the frozen base once
        # and then only the adapters (graft-lora through graft-vllm's LoRA loading, #39)
        "graft_rollout_adapter",
    }


def test_hooks_are_called_with_keywords_only() -> None:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    try:
        pm.hook.graft_step_begin(1)
    except TypeError:
        return
    raise AssertionError("a positional hook call must be rejected")


def test_every_hook_is_exercised_by_a_test() -> None:
    """Each hook needs a test function named ``test_hook_<hook name>...`` somewhere in tests/."""
    names = set()
    for path in TESTS.rglob("test_*.py"):
        if "plugins" in path.relative_to(TESTS).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_hook_"):
                names.add(node.name)
    missing = [h for h in hook_specs() if not any(n.startswith(f"test_hook_{h}") for n in names)]
    assert not missing, f"hooks without a test_hook_<name> test: {missing}"


def test_registry_hooks_sit_together_under_registration() -> None:
    """Every hook that takes no argument declares named things (a registry, sections, families):
    they are one module, `graft.hookspecs.registration`, so a plugin author finds every
    registry in one place."""
    registries = [name for name, spec in hook_specs().items()
                  if not inspect.signature(spec).parameters]
    assert len(registries) >= 9
    outside = [name for name in registries
               if hook_specs()[name].__module__ != "graft.hookspecs.registration"]
    assert not outside, f"registry hooks outside graft.hookspecs.registration: {outside}"
