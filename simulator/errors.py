"""User-facing errors: one clear sentence, exit code 2, no traceback (the CLI catches these)."""


class UserError(ValueError):
    """Bad input from the user: a config, a scenario, an option or a name. The message is one sentence."""
