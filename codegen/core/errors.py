"""One exception hierarchy; the CLI maps each class to an exit code (an API, see README)."""

from __future__ import annotations

import errno

EXIT_OK = 0
EXIT_DRIFT = 1
EXIT_USER = 2
EXIT_UPSTREAM = 3
EXIT_INTERRUPTED = 130


class CodegenError(Exception):
    """Base of every user-facing error: `str()` is the whole message, `hint` an optional fix."""

    exit_code = EXIT_USER

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class UserError(CodegenError):
    """Bad input: a spec, a path, an option."""


class UntrustedStorage(UserError):
    """A folder or file believed without checking each byte (a kernel cache, a backup) that
    someone else could have written: a link, another owner's, or writable by others."""


class SpecError(UserError):
    """A spec with errors; `message` holds every error, one per line, as file:line:col: ..."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


class DataFileError(UserError):
    """A data file (tuning CSV) with errors; one line per error, as file:line: column: message."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


class UpstreamError(CodegenError):
    """An AOTriton tree we refuse, or that its own tools reject."""

    exit_code = EXIT_UPSTREAM


class EnvironmentMissing(CodegenError):
    """The machine lacks what a stage needs to run: torch, Triton, a GPU. One rule for every
    stage (tune, validate, precompile): exit 3, like other failures outside the user's input."""

    exit_code = EXIT_UPSTREAM


class SystemFailure(CodegenError):
    """The machine failed an operation that should work: a full disk, an I/O error."""

    exit_code = EXIT_UPSTREAM


# OS errors the user can fix by choosing another path or fixing permissions (exit 2); any other
# (a full disk, an I/O error) is the machine's (exit 3).
USER_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR,
                         errno.ENAMETOOLONG, errno.ELOOP})


def os_failure(message: str, exc: OSError, hint: str | None = None) -> CodegenError:
    """One OSError as one message: UserError for a path the user chose badly, SystemFailure for
    the machine. `message` says what was being done and what state things were left in."""
    cls = UserError if exc.errno in USER_ERRNOS else SystemFailure
    return cls(message, hint=hint)


def os_reason(exc: OSError) -> str:
    """'<path>: <strerror> (<ERRNO>)' for a message."""
    name = errno.errorcode.get(exc.errno or 0, "")
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}" + (f" ({name})" if name else "")
