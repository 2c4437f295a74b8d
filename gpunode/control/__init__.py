"""The control host's side of the command line: the exit-status contract every command keeps,
the checkout an inventory belongs to, and ``gpunode doctor``."""
