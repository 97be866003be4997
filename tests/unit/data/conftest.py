import pytest

from megarl.models.tiny import build_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny models' tokenizer (byte-level BPE, ChatML template), built offline once."""
    return build_tokenizer(1001)
