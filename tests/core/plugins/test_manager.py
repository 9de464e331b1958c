"""Plugin discovery and loading against really installed plugin distributions."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import graft.plugins
from graft import hookimpl
from graft.errors import PluginError
from graft.plugins import GraftPluginManager
from graft.plugins.discovery import discover_candidates
from graft.plugins.manager import BUILTIN_PLUGINS
from graft.plugins.tracing import install_tracing


@pytest.fixture
def site(request: pytest.FixtureRequest, plugin_sites: dict[str, Path],
         monkeypatch: pytest.MonkeyPatch, clean_env: None) -> Path:
    """Put the plugin site named by the test's parametrization (default 'good') on sys.path."""
    path = plugin_sites[getattr(request, "param", "good")]
    monkeypatch.syspath_prepend(str(path))
    return path


def load(**kwargs) -> GraftPluginManager:
    manager = GraftPluginManager()
    manager.load(**kwargs)
    return manager


def test_discovery_reports_name_distribution_and_version(site: Path) -> None:
    found = {c.name: c for c in discover_candidates()}
    assert found["demo"].distribution == "graft-demo-plugin"
    assert found["demo"].version == "0.3.1"
    assert found["demo"].target == "graft_demo.plugin"
    assert found["broken"].distribution == "graft-broken-plugin"


def test_loaded_plugin_records_hooks_and_config_section(site: Path) -> None:
    manager = load()
    demo = manager.records["demo"]
    assert demo.status == "loaded"
    assert "graft_pre_shard" in demo.hooks and "graft_loss_aggregate" in demo.hooks
    assert demo.config_sections == ["demo"]
    assert manager.config_sections["demo"].plugin == "demo"


def test_plugin_failing_on_import_is_isolated(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = load()
    broken = manager.records["broken"]
    assert broken.status == "failed"
    assert "ImportError" in broken.error and "not_installed_kernels" in broken.error
    assert manager.records["demo"].status == "loaded"
    assert "broken" not in manager.loaded_names()
    assert "failed to load" in caplog.text


def test_empty_allowlist_loads_nothing(site: Path) -> None:
    manager = load(allowlist=[])
    assert {r.status for r in manager.records.values()} == {"disabled", "builtin"}
    assert manager.loaded_names() == list(BUILTIN_PLUGINS)
    assert manager.config_sections == {}


def test_allowlist_loads_only_named_plugins(site: Path) -> None:
    manager = load(allowlist=["demo"])
    assert manager.records["demo"].status == "loaded"
    assert manager.records["broken"].status == "disabled"


def test_explicitly_requested_broken_plugin_is_an_error(site: Path) -> None:
    with pytest.raises(PluginError, match="'broken'.*requested in GRAFT_PLUGINS.*failed to load"):
        load(allowlist=["broken"])


def test_explicitly_requested_missing_plugin_is_an_error(site: Path) -> None:
    with pytest.raises(PluginError, match="GRAFT_PLUGINS names the plugin 'dmeo'.*Did you mean 'demo'"):
        load(allowlist=["dmeo"])


def test_disabled_plugin_is_not_loaded(site: Path) -> None:
    manager = load(disabled=["demo"])
    assert manager.records["demo"].status == "disabled"
    assert "demo" not in manager.config_sections


def test_disabling_an_unknown_plugin_is_an_error(site: Path) -> None:
    with pytest.raises(PluginError, match="--disable-plugin.*'demoo'.*Did you mean 'demo'"):
        load(disabled=["demoo"])


@pytest.mark.parametrize("site", ["duplicate"], indirect=True)
def test_two_distributions_with_one_plugin_name_is_an_error(site: Path) -> None:
    with pytest.raises(PluginError) as info:
        load()
    assert "graft-demo-plugin" in str(info.value) and "graft-demo-twin" in str(info.value)


@pytest.mark.parametrize("site", ["typo"], indirect=True)
def test_misspelled_hook_name_fails_loudly(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = load()
    typo = manager.records["typo"]
    assert typo.status == "failed"
    assert "graft_pre_shrad" in typo.error and "Did you mean 'graft_pre_shard'" in typo.error
    assert "typo" in caplog.text
    with pytest.raises(PluginError, match="graft_pre_shrad"):
        load(allowlist=["typo"])


def test_wrong_argument_name_is_a_clear_error() -> None:
    class WrongArgs:
        @hookimpl
        def graft_pre_shard(self, model, config):
            pass

    with pytest.raises(PluginError) as info:
        GraftPluginManager().register(WrongArgs(), "wrong-args")
    message = str(info.value)
    assert "'config'" in message and "Did you mean 'cfg'" in message
    assert "graft_pre_shard(model, cfg, mesh, role, meshes)" in message


def test_undecorated_hook_function_is_a_clear_error() -> None:
    class Forgot:
        def graft_step_begin(self, step):
            pass

    with pytest.raises(PluginError, match="not decorated with @graft.hookimpl"):
        GraftPluginManager().register(Forgot(), "forgot")


def test_two_plugins_with_one_config_section_is_an_error(site: Path) -> None:
    from graft_demo.plugin import DemoConfig

    class Clash:
        @hookimpl
        def graft_config_sections(self):
            return [("demo", DemoConfig)]

    manager = load()
    with pytest.raises(PluginError, match="'demo' and 'clash' both declare.*features.demo"):
        manager.register(Clash(), "clash")
    assert "clash" not in dict(manager.pm.list_name_plugin())


def test_plugins_load_once_per_process(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graft.plugins, "_manager", None)
    first = graft.plugins.load_plugins()
    assert graft.plugins.get_plugin_manager() is first
    assert graft.plugins.load_plugins() is first
    with pytest.raises(RuntimeError, match="already loaded"):
        graft.plugins.load_plugins(disabled=["demo"])


def test_trace_prints_hook_calls_and_results(site: Path) -> None:
    manager = load(allowlist=["demo"])
    stream = io.StringIO()
    undo = install_tracing(manager.pm, stream)
    metrics: dict[str, float] = {}
    manager.hook.graft_step_end(step=3, metrics=metrics)
    undo()
    trace = stream.getvalue()
    assert "graft_step_end(step=3" in trace and "-> [demo]" in trace
    assert "graft_step_end => []" in trace


def test_trace_env_switch_installs_tracing(site: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GRAFT_TRACE_PLUGINS", "1")
    manager = load(allowlist=["demo"])
    manager.hook.graft_step_begin(step=1)
    assert "[graft.trace] graft_step_begin(step=1)" in capsys.readouterr().err


def test_registry_lookups_go_through_the_traced_hook_caller(site: Path) -> None:
    """Registries (policy losses, families, engines...) call each plugin through pluggy, so
    ``GRAFT_TRACE_PLUGINS`` shows them, and still know which plugin gave which name."""
    from graft.losses.registry import policy_losses

    manager = load(allowlist=["demo"])
    stream = io.StringIO()
    undo = install_tracing(manager.pm, stream)
    losses = policy_losses(manager)
    undo()
    trace = stream.getvalue()
    assert {"ppo", "demo-pg"} <= set(losses)
    assert "graft_policy_losses() -> [demo]" in trace
    assert "graft_policy_losses() -> [graft.losses.builtin]" in trace
