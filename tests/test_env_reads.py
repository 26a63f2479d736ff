"""paddle_flashmask._env.getenv reads what os.environ.get reads, after every kind of write."""

import os

from paddle_flashmask._env import getenv

NAME = "PADDLE_FLASHMASK_TEST_ENV_READ"


def test_unset_set_changed_deleted(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert getenv(NAME) is None and getenv(NAME, "d") == "d"
    monkeypatch.setenv(NAME, "1")
    assert getenv(NAME) == "1" == os.environ.get(NAME)
    os.environ[NAME] = ""  # empty is a value, not the default
    assert getenv(NAME, "d") == ""
    os.environ[NAME] = "ünïcode-\udcff"  # surrogate-escaped bytes round-trip as os.environ does
    assert getenv(NAME) == os.environ.get(NAME)
    del os.environ[NAME]
    assert getenv(NAME, "gone") == "gone"
    os.environ.update({NAME: "2"})
    assert getenv(NAME) == "2"
    os.environ.pop(NAME)
    assert getenv(NAME) is None


def test_every_switch_the_op_reads_agrees(monkeypatch):
    from paddle_flashmask import validation

    names = list(validation.INTEGER_ENV_SWITCHES) + list(validation.FA2_ENV_CHOICES)
    for i, name in enumerate(names):
        monkeypatch.setenv(name, str(i))
    assert [getenv(n) for n in names] == [os.environ.get(n) for n in names]
