"""The one kind of error a user can fix.

Every mistake a user can put right (a setting against the source, a bad record, a
truncated log, a missing topic, an unreachable sink, an unset setting, a Java or an extra
not installed, another definition's state, a run already going) is a ``UserError``; runs
and the CLI report one as a message naming the pipeline's file, not as a stack trace.
Each layer raises its own subclass, so this module sits below them all and imports
nothing.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: reported by its message, without a stack trace."""
