"""The engine's half of augur (Rust, pyo3); `augur`'s Python modules wrap it in Transformers' API."""

from typing import Callable, Optional

__version__: str

class Tokenizer:
    @staticmethod
    def load(spec: str) -> "Tokenizer": ...
    def encode(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...
    def apply_chat_template(self, messages: list[tuple[str, str]], add_generation_prompt: bool) -> str: ...
    def token_to_id(self, token: str) -> Optional[int]: ...
    def id_to_token(self, id: int) -> Optional[str]: ...
    def is_special(self, id: int) -> bool: ...
    def same_as(self, other: "Tokenizer") -> bool: ...
    path: str
    vocab_size: int
    bos_token: Optional[str]
    bos_token_id: Optional[int]
    eos_token: Optional[str]
    eos_token_ids: list[int]
    pad_token: Optional[str]
    pad_token_id: Optional[int]
    unk_token: Optional[str]
    chat_template: Optional[str]

class Model:
    @staticmethod
    def load(spec: str, quantization: Optional[str] = None) -> "Model": ...
    tokenizer: Optional[Tokenizer]
    path: str
    defaults: str
    config: dict
    batched_forwards: int
    def generate(
        self,
        rows: list[list[int]],
        options: str,
        assistant: Optional["Model"] = None,
        assistant_options: str = "{}",
        assistant_tokenizer: Optional[Tokenizer] = None,
        on_tokens: Optional[Callable[[list[int]], object]] = None,
    ) -> list[tuple[list[int], str, str]]: ...
