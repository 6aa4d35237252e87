"""te.ops.Sequential: torch.nn.Sequential whose runs of fusible operations
are each run by one OperationFuser (fuser.py).

Extra inputs of the call are handed to the fusers in order (each takes as
many as its ops have); the extra outputs of all fusers follow the main
output in the returned tuple.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from .fuser import OperationFuser
from .op import BasicOperation, FusibleOperation


class Sequential(torch.nn.Module):
    """A sequential container (a drop-in for ``torch.nn.Sequential``) that fuses
    adjacent ``FusibleOperation`` s.

    Args:
        *args: fusibleOperation or torch.nn.Module, or one dict of name -> module.
    """

    def __init__(self, *args) -> None:
        super().__init__()
        self._module_groups = None
        if len(args) == 1 and isinstance(args[0], dict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for module in args:
                self.append(module)

    def add_module(self, name: str, module) -> None:
        self._module_groups = None
        super().add_module(name, module)

    def _get_keys_by_idx(self, idx) -> list[str]:
        keys = list(self._modules.keys())
        if isinstance(idx, slice):
            return keys[idx]
        size = len(keys)
        if not -size <= idx < size:
            raise IndexError(f"Attempted to access index {idx}, but there are {size} entries")
        return [keys[idx]]

    def _next_key(self) -> str:
        taken = [int(k) for k in self._modules if k.isdigit()]
        return str(max(taken) + 1 if taken else 0)

    def __getitem__(self, idx):
        keys = self._get_keys_by_idx(idx)
        if isinstance(idx, slice):
            return Sequential().extend(self._modules[k] for k in keys)
        return self._modules[keys[0]]

    def __setitem__(self, idx: int, module) -> None:
        self._module_groups = None
        self._modules[self._get_keys_by_idx(idx)[0]] = module

    def __delitem__(self, idx) -> None:
        self._module_groups = None
        for key in self._get_keys_by_idx(idx):
            del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[torch.nn.Module]:
        return iter(self._modules.values())

    def append(self, module) -> Sequential:
        """Adds a module at the end."""
        self.add_module(self._next_key(), module)
        return self

    def extend(self, modules: Iterable) -> Sequential:
        """Adds modules at the end."""
        for module in modules:
            self.append(module)
        return self

    def insert(self, idx: int, module) -> Sequential:
        """Inserts a module before position idx (later ones move up one key)."""
        self._module_groups = None
        keys = self._get_keys_by_idx(slice(idx, None))
        keys.append(self._next_key())
        for i in reversed(range(1, len(keys))):
            self._modules[keys[i]] = self._modules[keys[i - 1]]
        self._modules[keys[0]] = module
        return self

    def pop(self, idx):
        """Removes and returns the module at idx."""
        out = self[idx]
        del self[idx]
        return out

    def __iadd__(self, modules) -> Sequential:
        return self.extend(modules)

    def __add__(self, modules) -> Sequential:
        return Sequential().extend(self).extend(modules)

    @staticmethod
    def _make_module_groups(modules) -> list:
        """The modules, with each run of fusible operations in one OperationFuser."""
        groups = []
        for module in modules:
            if isinstance(module, FusibleOperation):
                if not groups or not isinstance(groups[-1], list):
                    groups.append([])
                groups[-1].append(module)
            else:
                groups.append(module)
        return [OperationFuser(g) if isinstance(g, list) else g for g in groups]

    def _resolve_op_kwargs(self, op_kwargs) -> list:
        """Each fuser's per-basic-op keyword arguments from {module or index: kwargs}."""
        kwargs_by_op = {}
        for key, kwargs in (op_kwargs or {}).items():
            module = self[key] if isinstance(key, int) else key
            if not isinstance(module, BasicOperation):
                raise ValueError(
                    f"Attempted to provide forward kwargs to {type(module).__name__}, but Sequential only "
                    "allows providing forward kwargs to a BasicOperation."
                )
            kwargs_by_op[id(module)] = kwargs
        out = []
        for group in self._module_groups:
            if isinstance(group, OperationFuser) and kwargs_by_op:
                out.append([kwargs_by_op.pop(id(op), {}) for op in group._basic_ops])
            else:
                out.append(None)
        if kwargs_by_op:
            raise ValueError("op_kwargs contains keys that are not in this Sequential")
        return out

    def forward(self, input: torch.Tensor, *extra_inputs: torch.Tensor, op_kwargs=None):  # noqa: A002
        """Runs the modules in order; returns the output, or ``(output, *extra_outputs)``.

        op_kwargs: optional {contained basic op (or its index): keyword arguments
        of its op_forward}.
        """
        if self._module_groups is None:
            self._module_groups = self._make_module_groups(self._modules.values())
        group_kwargs = self._resolve_op_kwargs(op_kwargs)
        x, extra_outputs = input, []
        for group, kwargs in zip(self._module_groups, group_kwargs):
            if isinstance(group, OperationFuser):
                n = group.num_extra_inputs
                mine, extra_inputs = extra_inputs[:n], extra_inputs[n:]
                out = group(x, *mine, basic_op_kwargs=kwargs)
                if isinstance(out, tuple):
                    x = out[0]
                    extra_outputs.extend(out[1:])
                else:
                    x = out
            else:
                x = group(x)
        if extra_inputs:
            raise ValueError(f"te.ops.Sequential: {len(extra_inputs)} extra inputs were not used by any operation")
        return (x, *extra_outputs) if extra_outputs else x
