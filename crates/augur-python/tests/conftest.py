"""Paths of the repository's tiny fixtures and goldens, and the real models (catalogue names, pulled by
`.ci/run` before the tests run)."""

import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"

# The real GGUF models the Python tests read; `.ci/run` pulls them into augur's model cache.
QWEN = "qwen2.5-coder-0.5b"
SMOLLM = "smollm2-135m"


def fixture(name):
    return str(FIXTURES / name)


def golden(name):
    with open(FIXTURES / "golden" / f"{name}.json", encoding="utf-8") as f:
        return json.load(f)


def fixture_path(relative):
    """A golden's `tests/fixtures/...` path, from the repository root."""
    return str(ROOT / relative)


@pytest.fixture(scope="session")
def tiny_llama():
    import augur

    return augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    import augur

    return augur.AutoTokenizer.from_pretrained(fixture("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_assistant():
    import augur

    return augur.AutoModelForCausalLM.from_pretrained(fixture("tiny-llama-assistant"))


@pytest.fixture(scope="session")
def qwen():
    import augur

    return augur.AutoModelForCausalLM.from_pretrained(QWEN)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    import augur

    return augur.AutoTokenizer.from_pretrained(QWEN)
