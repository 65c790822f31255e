"""A Qwen2-architecture model and its tokenizer, built here (no hub): what
the vLLM tests, bench and demo serve and train.

    python -m tce.tools._vllm_model DIR [--hidden H] [--layers L]

writes DIR/config.json, DIR/model.safetensors and the tokenizer files,
float32 weights from a fixed seed. The tokenizer is a byte-level BPE
trained on a few sentences, enough to turn the tests' prompts into tokens.
Runs beside TCE and in the vLLM environment (both need transformers and
tokenizers).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

SENTENCES = [
    "The checkpoint engine keeps the newest weights in memory.",
    "Rollouts read each version from the cache of their node.",
    "A trainer publishes a version; the engines serve it next.",
    "the quick brown fox jumps over the lazy dog 0123456789",
]
VOCAB = 512


def tokenizer(directory: Path):
    """A byte-level BPE trained on SENTENCES, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # (its bars print empty lines off a terminal)
    tok.train_from_iterator(SENTENCES * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   pad_token="<|pad|>")
    fast.save_pretrained(directory)
    return fast


def config(hidden: int = 64, layers: int = 2):
    from transformers import Qwen2Config

    heads = max(2, hidden // 32)
    return Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=heads,
                       num_key_value_heads=max(1, heads // 2), max_position_embeddings=512,
                       tie_word_embeddings=False, torch_dtype="float32",
                       bos_token_id=0, eos_token_id=0, pad_token_id=1)


def build(directory: str | Path, *, hidden: int = 64, layers: int = 2, seed: int = 0):
    """Write the model and tokenizer to ``directory``; return the model."""
    from transformers import Qwen2ForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config(hidden, layers)).to(torch.float32)
    model.save_pretrained(directory)
    tokenizer(directory)
    return model


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """One step on random tokens: weights that change visibly."""
    model.train()
    g = torch.Generator().manual_seed(step)
    x = torch.randint(2, VOCAB, (4, 32), generator=g)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    build(a.dir, hidden=a.hidden, layers=a.layers)
