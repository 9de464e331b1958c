"""Routing the calls of the selected module *instances* through an `Offloader`.

Python looks ``__call__`` up on the type, so each selected instance is switched to a private
subclass of its own class whose ``__call__`` hands the call to the offloader; the class keeps
its name, every other instance of the original class is untouched, and FSDP2's later class
swap (``FSDP<cls>``) inherits the routing. The subclass's ``__call__`` wraps the class's own
``__call__``, and with it transformers' checkpointing, so the offload hook is the outer one:
transformers before 5.23 checkpoints in ``GradientCheckpointingLayer.__call__``, later versions
in a wrapper of each subclass's ``forward`` (the private subclass gets one too; only the
outermost checkpoints), inside ``nn.Module.__call__`` and so inside FSDP2's hooks and a block
compiled with ``Module.compile``.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from graft_offload.offloader import Offloader

# module -> (offloader, block index); weak, so a dropped model is forgotten.
_BINDINGS: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Offloader, int]] = \
    weakref.WeakKeyDictionary()
_SUBCLASSES: dict[type, type] = {}
ORIGINAL_CLASS = "_graft_offload_original_class"


def offload_subclass(cls: type) -> type:
    """The private subclass of ``cls`` whose instances route their calls to their offloader."""
    if getattr(cls, ORIGINAL_CLASS, None) is not None:
        return cls
    if cls not in _SUBCLASSES:

        def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            call = super(subclass, self).__call__
            binding = _BINDINGS.get(self)
            if binding is None:
                return call(*args, **kwargs)
            offloader, block = binding
            return offloader.run_block(block, call, args, kwargs)

        subclass = type(cls.__name__, (cls,), {"__call__": __call__, ORIGINAL_CLASS: cls,
                                               "__module__": cls.__module__,
                                               "__qualname__": cls.__qualname__})
        _SUBCLASSES[cls] = subclass
    return _SUBCLASSES[cls]


def route_calls(modules: Sequence[torch.nn.Module], offloader: Offloader) -> None:
    """Route each module's calls to ``offloader`` as block ``index`` (its position in
    ``modules``). A module already routed to an offloader is an error."""
    for index, module in enumerate(modules):
        if module in _BINDINGS:
            raise ValueError(f"{type(module).__name__} at block {index} already has its inputs "
                             f"offloaded; apply the offload once per model")
        module.__class__ = offload_subclass(type(module))
        _BINDINGS[module] = (offloader, index)


def unroute_calls(modules: Sequence[torch.nn.Module]) -> None:
    """Undo `route_calls` (before the model is sharded: the original class comes back)."""
    for module in modules:
        _BINDINGS.pop(module, None)
        original = getattr(type(module), ORIGINAL_CLASS, None)
        if original is not None and type(module) is _SUBCLASSES.get(original):
            module.__class__ = original


def routed_offloader(module: torch.nn.Module) -> Offloader | None:
    """The offloader ``module``'s calls go to, or None."""
    binding = _BINDINGS.get(module)
    return binding[0] if binding else None
