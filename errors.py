"""The one exception type for mistakes a user can make (bad config, missing file, unknown name).

The CLI prints it as a single line and exits with code 2; anything else is a bug and keeps its traceback.
"""


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
