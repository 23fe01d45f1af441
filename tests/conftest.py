import pytest

from simulator.config import load_model


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny-k3")


@pytest.fixture(scope="session")
def tiny_ds():
    return load_model("tiny-deepseek")


@pytest.fixture(scope="session")
def k3():
    return load_model("kimi-k3")
