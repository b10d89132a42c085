"""The shipped reasoning-gym catalog reads without reasoning-gym, whatever else of the family was imported."""

import importlib


def test_importing_the_catalog_writer_keeps_the_reader_working():
    package = importlib.import_module("toolgym.envs.reasoning_gym")
    # the writer module becomes an attribute of the package once imported: it once replaced a function of
    # the same name, and working_tasks() then called a module
    importlib.import_module("toolgym.envs.reasoning_gym.catalog")
    rows = package.read_catalog()
    assert len(rows) >= 100 and {"task", "status"} <= set(rows[0])
    working = package.working_tasks()
    assert "chain_sum" in working and set(working) <= {r["task"] for r in rows}
