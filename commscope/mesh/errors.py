"""Mesh errors: commscope's messages, raised as the exception types torch raises too.

Every mesh error is a :class:`MeshError` (a ``ValueError``: the request is impossible,
and the message shows the arithmetic and the fix). Where PyTorch's ``DeviceMesh`` raises
another type for the same mistake, ours is an instance of that type as well, so code
written against torch keeps catching it:

========================  ==========================================================
``MeshKeyError``          an unknown axis name, a slice out of order (torch: KeyError)
``MeshIndexError``        an axis index out of range (torch: IndexError)
``MeshRuntimeError``      a bad device type, repeated names, names that do not match
                          the shape, a mesh bigger than the world, a slice of an
                          unnamed mesh, an axis left out on an n-D mesh (torch:
                          RuntimeError)
========================  ==========================================================

Where torch's wording is what people search for, the message starts with it.
No torch is imported here: planning raises the same errors on a laptop.
"""

from __future__ import annotations

__all__ = ["MeshError", "MeshIndexError", "MeshKeyError", "MeshRuntimeError"]


class MeshError(ValueError):
    """A mesh asked for is impossible; the message shows the arithmetic and the fix."""


class MeshKeyError(MeshError, KeyError):
    """An axis name that the mesh does not have here (also a ``KeyError``, as torch's)."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's quoted repr


class MeshIndexError(MeshError, IndexError):
    """An axis index out of range (also an ``IndexError``, as torch's)."""


class MeshRuntimeError(MeshError, RuntimeError):
    """A mesh request torch refuses with a ``RuntimeError`` (also one here)."""
