"""The one exception type for mistakes a user can make (bad config, missing file, unknown name).

The CLI prints it as a single line and exits with code 2; anything else is a bug and keeps its traceback.
"""

import re


class RedlineError(Exception):
    """A problem the user can fix: the message names it in one line."""


def unwrap_user_error(err: BaseException) -> RedlineError | None:
    """The RedlineError behind `err`, if any: Ray wraps exceptions raised inside actors and tasks."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, RedlineError):
            # Ray re-raises a remote error as a class deriving from both RayTaskError and the
            # original; its message is the remote traceback, the original is its `cause`.
            inner = getattr(current, "cause", None)
            return inner if isinstance(inner, RedlineError) else current
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        current = cause if isinstance(cause, BaseException) else (current.__cause__ or current.__context__)
    return None


def first_line(err: BaseException | str) -> str:
    """The first non-empty line of an error's message (or its type name): one-line error reports."""
    text = str(err).strip()
    if text:
        return text.splitlines()[0].strip()
    return type(err).__name__ if isinstance(err, BaseException) else ""


def last_line(err: BaseException | str) -> str:
    """The last non-empty line (a remote traceback's own message)."""
    text = str(err).strip()
    return text.splitlines()[-1].strip() if text else (type(err).__name__ if isinstance(err, BaseException) else "")


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def root_cause(err: BaseException) -> BaseException:
    """The innermost exception behind `err`: Ray re-raises a remote failure wrapped (the actor's name,
    a remote traceback, terminal colours) with the original as its `cause`."""
    seen: set[int] = set()
    current = err
    while id(current) not in seen:
        seen.add(id(current))
        inner = getattr(current, "cause", None)
        inner = inner if isinstance(inner, BaseException) else (current.__cause__ or current.__context__)
        if inner is None:
            break
        current = inner
    return current


def cause_line(err: BaseException) -> str:
    """One line that says why something failed: a user error's message, else the root cause as
    `Type: message`, without Ray's wrapping or colour codes."""
    user = unwrap_user_error(err)
    if user is not None:
        return _ANSI.sub("", first_line(user))
    cause = root_cause(err)
    message = _ANSI.sub("", first_line(cause)) if str(cause).strip() else ""
    name = type(cause).__name__
    return f"{name}: {message}" if message and message != name else name
