"""A builtin's text signature, parsed once in the warm process rather than in each fork.

``MagicMock(spec=cls)`` asks ``inspect.signature`` for the spec's constructor. When
that is a builtin with a text signature (``object.__init__``, for a class that defines
no ``__init__``: vLLM's ``OffloadingManager``, mocked for every scheduler its tests
build), ``inspect`` parses the text again on each call, and copies ``sys.modules`` to
do it. In a fork of the warm process, that copy writes the reference count of every
module object and of its name (about 2,500 modules once vLLM is imported), each on a
page shared with the parent: about 4,400 pages copied on write, 12-13 ms of each
fork's time, before its first test has done anything of its own.

So the warm process keeps what it has parsed: :func:`install` wraps
``inspect._signature_fromstr`` in a table keyed by everything the parse reads (the text,
the signature class, whether the first parameter is dropped, and of the callable only
its module's name, whether that module is imported, and whether the callable is bound,
and to a module). The key holds no reference to the callable, so a method bound to a
test's object does not keep that object alive. The baseline's tests fill the table in
the warm process, and each fork finds their signatures parsed. The answer is the one
``inspect`` gives (a ``Signature`` is immutable); a parse that fails is not kept and
fails again the next time; a callable whose attributes cannot be read is parsed as
before. The wrap is installed in the audit's warm test processes only, like the huge
pages (:mod:`.hugepages`): it is the fork executor's, and mutmut's runs in the
benchmark go without it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Hashable
from typing import Any

_NAME = "_signature_fromstr"  # inspect's parser of a text signature, 3.8 to 3.13
_MARK = "_fence_audit_parsed_once"


def install() -> bool:
    """Wrap inspect's text-signature parser with the table (once); whether it is."""
    parse: Callable[..., Any] | None = getattr(inspect, _NAME, None)
    if parse is None:
        return False
    if getattr(parse, _MARK, False):
        return True
    parsed: dict[Hashable, Any] = {}

    @functools.wraps(parse)
    def parse_once(cls: Any, obj: Any, s: str, skip_bound_arg: bool = True) -> Any:
        try:
            key = (cls, s, skip_bound_arg, *_read_by_parse(obj))
            hash(key)
        except Exception:  # inspect's own parse meets it, as it would have
            return parse(cls, obj, s, skip_bound_arg)
        if key not in parsed:
            parsed[key] = parse(cls, obj, s, skip_bound_arg)
        return parsed[key]

    setattr(parse_once, _MARK, True)
    setattr(inspect, _NAME, parse_once)
    return True


def _read_by_parse(obj: Any) -> tuple[Hashable, ...]:
    """What inspect's parse reads of the callable, beyond its text signature: its
    module's name and whether that module is imported (the defaults are evaluated in
    its namespace), whether it is bound, and whether to a module."""
    module_name = getattr(obj, "__module__", None)
    bound_to = getattr(obj, "__self__", None)
    imported = isinstance(module_name, str) and sys.modules.get(module_name) is not None
    return module_name, imported, bound_to is not None, inspect.ismodule(bound_to)
