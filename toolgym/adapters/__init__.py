"""Adapters that hand toolgym envs to other training stacks (``trl``: TRL's ``environment_factory``).

Each adapter module imports its outside package only when used.
"""
