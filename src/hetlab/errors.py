"""The one exception type for mistakes a user can fix; the CLI prints it as one line."""


class UserError(Exception):
    """Bad input or a missing resource. The message says what is wrong and what to do."""
