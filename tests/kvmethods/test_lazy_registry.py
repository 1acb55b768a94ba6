"""kvmethods/core/lazy_registry.py: the one registry type of methods, tasks, named models and presets.

Its own behaviour, on a kind made up here: lazy "module:attribute" entries import their module only when that
name is asked for, entry points come from a real distribution's metadata (a dist-info folder on sys.path, read
by importlib.metadata), and an unknown name is refused in one line naming the closest names.
"""

from __future__ import annotations

import sys

import pytest

from kvmethods.core.lazy_registry import LazyRegistry, close_names, unknown_name_message

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


class WidgetError(ValueError):
    pass


def install_distribution(root, module: str, source: str, group: str, points: dict[str, str]) -> None:
    """A module and an installed distribution's metadata declaring entry points, as pip would leave them."""
    (root / f"{module}.py").write_text(source)
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in points.items())
    (dist / "entry_points.txt").write_text(f"[{group}]\n{lines}")


def widgets(tmp_path, monkeypatch, **kwargs) -> LazyRegistry:
    (tmp_path / "lazy_widget_impl.py").write_text("WIDGET = 'the lazily imported widget'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = {"alpha": "lazy_widget_impl:WIDGET", "beta": ("an object", "not a string")}
    return LazyRegistry("widget", "kvbench_test.widgets", lambda: entries, error=WidgetError, **kwargs)


def test_a_lazy_entry_is_imported_only_when_its_name_is_asked_for(tmp_path, monkeypatch):
    registry = widgets(tmp_path, monkeypatch)
    monkeypatch.delitem(sys.modules, "lazy_widget_impl", raising=False)
    assert registry.names() == ["alpha", "beta"] and "alpha" in registry and "gamma" not in registry
    assert "lazy_widget_impl" not in sys.modules
    assert registry.get("beta") == ("an object", "not a string")
    assert "lazy_widget_impl" not in sys.modules
    assert registry.get("alpha") == "the lazily imported widget"


def test_an_unknown_name_is_one_line_naming_the_closest_and_every_name(tmp_path, monkeypatch):
    registry = widgets(tmp_path, monkeypatch, note="or a widget file")
    with pytest.raises(WidgetError) as refused:
        registry.get("alpah")
    assert str(refused.value) == "unknown widget 'alpah' (did you mean 'alpha'?); valid widgets: alpha, beta; " \
                                 "or a widget file"
    with pytest.raises(WidgetError, match=r"^unknown widget 'zzz'; valid widgets: alpha, beta; or a widget file$"):
        registry.get("zzz")
    with pytest.raises(WidgetError, match=r"^unknown widget 3; valid"):
        registry.get(3)


def test_close_names_begin_with_what_was_typed_then_look_alike():
    names = ["snapkv", "capkv", "keydiff", "kivi", "knorm", "streamingllm"]
    assert close_names("snapk", names) == ["snapkv", "capkv"]
    assert close_names("k", names) == ["keydiff", "kivi", "knorm"]  # at most three
    assert close_names("SnapKV", names)[0] == "snapkv" and close_names("", names) == []
    message = unknown_name_message("method", "k", names)
    assert message.startswith("unknown method 'k' (did you mean 'keydiff', 'kivi' or 'knorm'?); valid methods: ")
    long = unknown_name_message("task", "x" * 500, names)
    assert "(500 characters)" in long and len(long) < 200


def test_entry_points_of_an_installed_distribution_join_the_names(tmp_path, monkeypatch):
    registry = widgets(tmp_path, monkeypatch, check=lambda obj, origin: obj.upper())
    install_distribution(tmp_path, "third_party_widgets", "GADGET = 'gadget'\n", "kvbench_test.widgets",
                         {"gadget": "third_party_widgets:GADGET", "broken": "no_such_module_here:THING"})
    assert registry.names() == ["alpha", "beta", "broken", "gadget"]
    assert registry.get("gadget") == "GADGET"  # loaded, then checked
    with pytest.raises(WidgetError, match=r"^entry point 'broken' \(kvbench_test.widgets: no_such_module_here:THING\) "
                                          r"failed to load: ModuleNotFoundError"):
        registry.get("broken")


def test_registering_adds_a_name_and_refuses_a_clash(tmp_path, monkeypatch):
    registry = widgets(tmp_path, monkeypatch)
    thing = object()
    assert registry.register("delta", thing) is thing and registry.register("delta", thing) is thing
    assert registry.get("delta") is thing and "delta" in registry.names()
    with pytest.raises(WidgetError, match=r"^a widget named 'beta' already exists \(built-in widget 'beta'\)"):
        registry.register("beta", object())
    registry.unregister("delta")
    assert "delta" not in registry
