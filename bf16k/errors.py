"""The one error type the tooling raises for bad input; the CLI prints it without a traceback."""


class ToolError(Exception):
    """A condition the user must act on (wrong pin, checksum mismatch, conflict, dirty tree...)."""
