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


def test_env_names_reads_what_os_environ_does(monkeypatch):
    from paddle_flashmask._env import EnvNames

    names = [NAME + "_A", NAME + "_B", NAME + "_C"]
    group = EnvNames(names)
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert group.set_values() == []
    monkeypatch.setenv(names[2], "3")
    os.environ[names[1]] = ""  # set but empty: the switches treat it as unset
    assert group.set_values() == [(names[2], "3")]
    monkeypatch.setenv(names[0], "ünïcode-\udcff")
    assert group.set_values() == [(names[0], os.environ[names[0]]), (names[2], "3")]
    del os.environ[names[2]]
    assert group.set_values() == [(names[0], os.environ[names[0]])]
    del os.environ[names[1]]


def test_switch_check_names_the_bad_switch(monkeypatch):
    import pytest

    from paddle_flashmask import validation

    for name in list(validation.INTEGER_ENV_SWITCHES) + list(validation.FA2_ENV_CHOICES):
        monkeypatch.delenv(name, raising=False)
    validation.check_env_switches()
    monkeypatch.setenv("PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES", "0")  # its range starts at 1
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES must be an integer in \\[1, 256\\]"):
        validation.check_env_switches()
    monkeypatch.setenv("PADDLE_FLASHMASK_SM90_BWD_ORDER_CLASSES", "256")
    monkeypatch.setenv("PADDLE_FLASHMASK_FA2_BWD", "fast")
    with pytest.raises(ValueError, match="PADDLE_FLASHMASK_FA2_BWD must be one of"):
        validation.check_env_switches()
    monkeypatch.setenv("PADDLE_FLASHMASK_FA2_BWD", "split")
    validation.check_env_switches()
