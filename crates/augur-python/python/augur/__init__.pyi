"""Type stubs of augur's public API (Transformers' names; see the modules' docstrings)."""

from queue import Queue
from typing import Any, Iterator, Optional, Sequence, Union

from . import _native

__version__: str

TokenIds = Union[Sequence[int], Sequence[Sequence[int]], Any]  # lists, a numpy array or a torch tensor
Message = dict[str, str]

class BatchEncoding(dict[str, Any]):
    input_ids: Any
    attention_mask: Any
    def to(self, device: Any) -> "BatchEncoding": ...

class PreTrainedTokenizer:
    name_or_path: str
    padding_side: str
    vocab_size: int
    bos_token: Optional[str]
    bos_token_id: Optional[int]
    eos_token: Optional[str]
    eos_token_id: Optional[int]
    pad_token: Optional[str]
    pad_token_id: Optional[int]
    unk_token: Optional[str]
    chat_template: Optional[str]
    def __init__(self, native: _native.Tokenizer, name_or_path: Optional[str] = None) -> None: ...
    def __len__(self) -> int: ...
    def __call__(self, text: Union[str, Sequence[str]], add_special_tokens: bool = True,
                 padding: Union[bool, str] = False, return_tensors: Optional[str] = None,
                 return_attention_mask: bool = True, truncation: Optional[bool] = None,
                 max_length: Optional[int] = None) -> BatchEncoding: ...
    def encode(self, text: str, add_special_tokens: bool = True, return_tensors: Optional[str] = None) -> Any: ...
    def decode(self, token_ids: TokenIds, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: Optional[bool] = None) -> str: ...
    def batch_decode(self, sequences: TokenIds, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: Optional[bool] = None) -> list[str]: ...
    def convert_tokens_to_ids(self, tokens: Union[str, Sequence[str]]) -> Any: ...
    def convert_ids_to_tokens(self, ids: Union[int, Sequence[int]]) -> Any: ...
    def apply_chat_template(self, conversation: Sequence[Message], add_generation_prompt: bool = False,
                            tokenize: bool = True, return_tensors: Optional[str] = None, return_dict: bool = False,
                            continue_final_message: bool = False) -> Any: ...

class AutoTokenizer:
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, **kwargs: Any) -> PreTrainedTokenizer: ...

class GenerationConfig:
    def __init__(self, **kwargs: Any) -> None: ...
    @classmethod
    def from_pretrained(cls, pretrained_model_name: Any,
                        config_file_name: str = "generation_config.json") -> "GenerationConfig": ...
    def to_dict(self) -> dict[str, Any]: ...
    def update(self, **kwargs: Any) -> dict[str, Any]: ...
    def __getattr__(self, name: str) -> Any: ...

class GenerateDecoderOnlyOutput(dict[str, Any]):
    sequences: Any
    stats: list[dict[str, Any]]
    scores: None
    logits: None

class ModelConfig:
    def to_dict(self) -> dict[str, Any]: ...
    def get_text_config(self) -> "ModelConfig": ...
    def __getattr__(self, name: str) -> Any: ...

class BaseStreamer:
    def put(self, value: Any) -> None: ...
    def end(self) -> None: ...

class TextStreamer(BaseStreamer):
    tokenizer: PreTrainedTokenizer
    skip_prompt: bool
    def __init__(self, tokenizer: PreTrainedTokenizer, skip_prompt: bool = False, **decode_kwargs: Any) -> None: ...
    def on_finalized_text(self, text: str, stream_end: bool = False) -> None: ...

class TextIteratorStreamer(TextStreamer):
    text_queue: Queue
    timeout: Optional[float]
    def __init__(self, tokenizer: PreTrainedTokenizer, skip_prompt: bool = False, timeout: Optional[float] = None,
                 **decode_kwargs: Any) -> None: ...
    def __iter__(self) -> Iterator[str]: ...
    def __next__(self) -> str: ...

class AugurModelForCausalLM:
    name_or_path: str
    config: ModelConfig
    generation_config: GenerationConfig
    device: Any
    def eval(self) -> "AugurModelForCausalLM": ...
    def to(self, device: Any) -> "AugurModelForCausalLM": ...
    def generate(self, inputs: Optional[TokenIds] = None, generation_config: Optional[GenerationConfig] = None,
                 logits_processor: Any = None, stopping_criteria: Any = None, prefix_allowed_tokens_fn: Any = None,
                 synced_gpus: Optional[bool] = None, assistant_model: Optional["AugurModelForCausalLM"] = None,
                 streamer: Optional[BaseStreamer] = None, negative_prompt_ids: Any = None,
                 negative_prompt_attention_mask: Any = None, custom_generate: Any = None, **kwargs: Any) -> Any: ...

class AutoModelForCausalLM:
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, **kwargs: Any) -> AugurModelForCausalLM: ...

class TextGenerationPipeline:
    model: AugurModelForCausalLM
    tokenizer: PreTrainedTokenizer
    assistant_model: Optional[AugurModelForCausalLM]
    assistant_tokenizer: Optional[PreTrainedTokenizer]
    def __call__(self, text_inputs: Any, return_full_text: Optional[bool] = None,
                 return_tensors: Optional[bool] = None, return_text: Optional[bool] = None,
                 clean_up_tokenization_spaces: Optional[bool] = None, prefix: Optional[str] = None,
                 stop_sequence: Optional[Union[str, Sequence[str]]] = None,
                 continue_final_message: Optional[bool] = None, skip_special_tokens: Optional[bool] = None,
                 **generate_kwargs: Any) -> list[Any]: ...

def pipeline(task: Optional[str] = None, model: Any = None, tokenizer: Any = None, assistant_model: Any = None,
             assistant_tokenizer: Any = None, device: Any = None, device_map: Any = None, dtype: Any = None,
             torch_dtype: Any = None, **kwargs: Any) -> TextGenerationPipeline: ...
