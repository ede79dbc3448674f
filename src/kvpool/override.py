"""`override`: the one spelling of `typing.override` for every package of kvpool.

`typing.override` arrived in Python 3.12; kvpool supports 3.11, where `typing_extensions` is not
a run-time dependency. The type checker always sees the real marker; at run time on 3.11 a
no-op stands in for it (the marker only states intent, it changes nothing at run time).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["override"]

_F = TypeVar("_F", bound=Callable[..., Any])

if sys.version_info >= (3, 12):
    from typing import override
elif TYPE_CHECKING:
    from typing_extensions import override
else:

    def override(func: _F) -> _F:
        return func
