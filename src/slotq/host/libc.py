"""libc functions the standard library does not wrap (prctl, inotify).

Through `_ctypes`, the C core of ctypes: importing `ctypes` and opening libc
with it costs about 2.0 ms of CPU and 0.3 MB of every process that does it
(measured here); this costs 0.4 ms and 64 kB. The interpreter already links
libc, so dlopen(NULL) finds it (ctypes.util.find_library would spawn
ldconfig). Every function returns a C int and keeps errno for `errno()`.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_fn_type: Callable[[int], Callable[..., int]] | None = None
_libc_handle = 0


def function(name: str) -> Callable[..., int] | None:
    """libc's `name`, or None when libc has no such function. Should the
    private parts of `_ctypes` used here change, plain ctypes is used."""
    global _fn_type, _libc_handle
    try:
        import _ctypes

        if _fn_type is None:
            class _Int(_ctypes._SimpleCData):  # type: ignore[type-arg]
                _type_ = "i"

            class _Fn(_ctypes.CFuncPtr):
                _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
                _restype_ = _Int

            _libc_handle = _ctypes.dlopen(None)  # type: ignore[arg-type]
            _fn_type = _Fn
        address = _ctypes.dlsym(_libc_handle, name)
    except OSError:
        return None  # no such symbol
    except (ImportError, AttributeError, TypeError):
        try:
            import ctypes

            found: Callable[..., int] = getattr(ctypes.CDLL(None, use_errno=True), name)
            return found
        except (ImportError, OSError, AttributeError):
            return None
    return _fn_type(address)


def errno() -> int:
    """errno as the last libc function called through this module left it."""
    import _ctypes

    return int(_ctypes.get_errno())
