"""Ranks with roles (``graft_rank_roles``, ``graft_role_runner``): `rank_roles` checks a
plugin's split, `init_distributed` gives each role its own meshes, and in a real ``graft train
--nproc 3`` run (gloo, CPU) the test plugin graft-roles-plugin (tests/plugins) makes the last
rank a helper that runs its runner while the two others train as a 2-rank run does. No
graft-async-rl."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from graft import hookimpl
from graft.config import compose
from graft.engine.distributed.env import init_distributed, rank_roles
from graft.errors import ConfigError

# Short SFT runs on the tiny Llama that keep a checkpoint (saved by the trainers alone).
RUN = ("trainer.mode=sft", "model.preset=tiny-llama", "trainer.total_steps=2",
       "checkpoint.every_steps=0", "export.hf_at_end=false")
COMPARED = ("loss", "grad_norm", "tokens")


class Split:
    """A plugin that returns a fixed split of the ranks and records the world it was told."""

    def __init__(self, roles: dict[str, list[int]] | None) -> None:
        self.roles = roles
        self.worlds: list[int] = []

    @hookimpl
    def graft_rank_roles(self, cfg, world_size):
        self.worlds.append(world_size)
        return self.roles


def roles_of(graft_plugin, monkeypatch: pytest.MonkeyPatch, roles: dict | None,
             world: int = 3) -> dict[str, tuple[int, ...]] | None:
    """`rank_roles` of a torchrun world of ``world`` ranks, with a plugin answering ``roles``."""
    monkeypatch.setenv("WORLD_SIZE", str(world))
    plugin = Split(roles)
    manager = graft_plugin(plugin, name="split")
    found = rank_roles(compose([]), manager)
    assert plugin.worlds == [world]
    return found


def test_hook_graft_rank_roles_split_is_checked_and_kept(graft_plugin,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert roles_of(graft_plugin, monkeypatch, {"trainer": [0, 1], "helper": [2]}) == {
        "trainer": (0, 1), "helper": (2,)}
    assert roles_of(graft_plugin, monkeypatch, None) is None  # every rank trains


@pytest.mark.parametrize("roles", [
    {"trainer": [0], "helper": [2]},  # rank 1 has no role
    {"trainer": [0, 1], "helper": [1, 2]},  # rank 1 has two
    {"trainer": [0, 1, 2, 3]},  # a rank torchrun did not start
    {"helper": [0, 1, 2]},  # nobody trains
    {"trainer": [], "helper": [0, 1, 2]},
])
def test_a_split_without_every_rank_once_or_without_trainers_is_a_config_error(
        graft_plugin, monkeypatch: pytest.MonkeyPatch, roles: dict[str, list[int]]) -> None:
    with pytest.raises(ConfigError, match=r"each of the 3 ranks one role.*'trainer'.*"
                                          r"graft_rank_roles"):
        roles_of(graft_plugin, monkeypatch, roles)


def test_init_distributed_gives_a_rank_its_roles_env() -> None:
    """One process (world 1): the rank's role, its ranks, a group of the role; only a trainer
    is the main rank; a rank that no role names is refused."""
    trainer = init_distributed(device_preference="cpu", roles={"trainer": (0,)})
    assert (trainer.role, trainer.role_ranks, trainer.rank, trainer.world_size) == (
        "trainer", (0,), 0, 1)
    assert trainer.is_main and dist.get_world_size(trainer.group) == 1
    helper = init_distributed(device_preference="cpu", roles={"helper": [0]})
    assert helper.role == "helper" and not helper.is_main
    assert init_distributed(device_preference="cpu").group is None  # no roles: the default
    with pytest.raises(ConfigError, match="rank 0 has no role"):
        init_distributed(device_preference="cpu", roles={"trainer": (1,)})


@pytest.mark.slow  # two graft train processes (~25 s on 2 cores)
def test_hook_graft_role_runner_runs_the_helper_while_two_ranks_train(
        graft_train, run_graft, metrics_of, plugin_sites: dict[str, Path], tmp_path: Path,
        clean_env: None) -> None:
    with_helper, plain = tmp_path / "helper", tmp_path / "plain"
    done = run_graft(["train", "--nproc", "3", f"trainer.run_dir={with_helper}", *RUN],
                     site=plugin_sites["roles"])
    assert done.returncode == 0, done.stderr[-4000:]
    graft_train(plain, *RUN, nproc=2)  # no roles: both ranks train
    record = json.loads((with_helper / "helper-2.json").read_text())
    assert record == {"role": "helper", "rank": 0, "world_size": 1, "role_ranks": [2],
                      "global_rank": 2, "group_size": 1, "is_main": False, "total_steps": 2,
                      "run_dir": str(with_helper)}
    assert not list(with_helper.glob("helper-[01].json"))  # the trainers did not run it
    rows, expected = metrics_of(with_helper), metrics_of(plain)
    assert [row["step"] for row in rows] == [1, 2]  # every step once: trainer rank 0 logs
    for row, other in zip(rows, expected, strict=True):
        for name in COMPARED:  # the trainers' data-parallel world is 2, not 3
            assert row[name] == pytest.approx(other[name], rel=1e-6), (row["step"], name)
    assert (with_helper / "checkpoints" / "step_2").is_dir()  # saved by the trainers' group
