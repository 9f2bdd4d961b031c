"""augur: assisted (speculative) decoding on the CPU, behind the Transformers API of its assisted-decoding guide.

    from augur import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained("qwen2.5-coder-1.5b")
    model = AutoModelForCausalLM.from_pretrained("qwen2.5-coder-1.5b")
    inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
    outputs = model.generate(**inputs, prompt_lookup_num_tokens=10, max_new_tokens=20)
    print(tokenizer.batch_decode(outputs, skip_special_tokens=True))
"""

from ._native import __version__
from .generation import GenerateDecoderOnlyOutput, GenerationConfig
from .modeling import AugurModelForCausalLM, AutoModelForCausalLM, ModelConfig
from .pipelines import TextGenerationPipeline, pipeline
from .streamers import BaseStreamer, TextIteratorStreamer, TextStreamer
from .tokenization import AutoTokenizer, BatchEncoding, PreTrainedTokenizer

__all__ = [
    "AugurModelForCausalLM", "AutoModelForCausalLM", "AutoTokenizer", "BaseStreamer", "BatchEncoding",
    "GenerateDecoderOnlyOutput", "GenerationConfig", "ModelConfig", "PreTrainedTokenizer", "TextGenerationPipeline",
    "TextIteratorStreamer", "TextStreamer", "__version__", "pipeline",
]
