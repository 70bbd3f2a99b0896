"""The ground floor: pieces every other room shares (errors, limits, numbers, TOML, processes).

Nothing here imports anything else of the project, so the trainer, the store and the CLI can all
stand on it without depending on each other.
"""
