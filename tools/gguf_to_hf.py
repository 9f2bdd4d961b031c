"""Writes a GGUF file (a catalogue model, say) as a Hugging Face model directory: the weights dequantized by
Transformers and stored in bf16 (or f16 / f32) safetensors, with config.json, generation_config.json and the
tokenizer (tokenizer.json, tokenizer_config.json with the chat template). This is how the guide's readers hold
their models; the tests and benchmarks use it to get real-size checkpoints without a hub.

Usage:
    augur pull qwen2.5-coder-0.5b
    python tools/gguf_to_hf.py ~/.cache/augur/models/qwen2.5-coder-0.5b-instruct.gguf /tmp/qwen05-bf16 [--dtype bf16]

Needs: pip install torch==2.15.0 transformers==5.24.0 gguf accelerate (about 5.6 GB with the CUDA libraries of the PyPI torch wheel); versions are recorded
in the directory's `augur_conversion.json`.
"""
import argparse
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf", help="the GGUF file")
    ap.add_argument("out", help="the directory to write (created; must not hold a model already)")
    ap.add_argument("--dtype", choices=["bf16", "f16", "f32"], default="bf16")
    a = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.abspath(os.path.expanduser(a.gguf))
    if not os.path.isfile(path):
        sys.exit(f"gguf_to_hf: {path} is not a file (pull it first: augur pull NAME)")
    if os.path.exists(os.path.join(a.out, "config.json")):
        sys.exit(f"gguf_to_hf: {a.out} already holds a model")
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    folder, name = os.path.split(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    # A model loaded from GGUF refuses to be saved (its config names the GGUF "quantization"): its dequantized
    # weights go into a plain model of the same config instead.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out, safe_serialization=True)
    tokenizer.save_pretrained(a.out)
    with open(os.path.join(a.out, "augur_conversion.json"), "w") as f:
        json.dump({"source": name, "dtype": a.dtype, "torch": torch.__version__,
                   "transformers": transformers.__version__}, f, indent=2)
    size = sum(os.path.getsize(os.path.join(a.out, n)) for n in os.listdir(a.out) if n.endswith(".safetensors"))
    print(f"gguf_to_hf: wrote {a.out} ({size / 1e6:.0f} MB of {a.dtype} safetensors)")


if __name__ == "__main__":
    main()
