"""An inference process for tests/test_weights_serving.py: serves a tiny
Hugging Face model with ``generate()`` and swaps in each version a trainer
publishes, between requests, without restarting.

    python weights_infer.py ARCH OUT LAST

TCE_SOCKET and TCE_JOB come from the environment. The loop is the one
docs/weights.md shows: ``wait_newer`` -> ``open`` -> ``load_into(model)``,
then one request (the logits of ``INPUT`` and a greedy ``generate()`` from
``PROMPT``), written to OUT/v<version>.pt, until version LAST is served.
The previous version stays open until the next one is loaded (a reader
moving from v to v+1 holds both for a moment), and its tensors, viewing the
cache, must still hold what was read from them then (``prev_intact``): a
trainer that saved the same path meanwhile must not have written into them.
"""

from __future__ import annotations

import os
import sys

import torch

INPUT = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 4]])
PROMPT = torch.tensor([[5, 17, 42, 7]])
NEW_TOKENS = 8


def tiny_model(arch: str) -> torch.nn.Module:
    """A 2-layer model, hidden 64, vocabulary 128, built from a config (no
    download), with seeded random weights."""
    import transformers

    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=128,
                                         n_positions=64, pad_token_id=0, bos_token_id=None,
                                         eos_token_id=None)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64, tie_word_embeddings=False,
                                      pad_token_id=0, bos_token_id=None, eos_token_id=None)
    return transformers.LlamaForCausalLM(config)


def request(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed request: the logits of INPUT, and greedy generate() from PROMPT."""
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=INPUT).logits
        tokens = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT),
                                max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return logits, tokens


def main() -> None:
    from tce import weights
    from tce.errors import FailedPreconditionError

    arch, out, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = tiny_model(arch)
    served, prev = 0, None
    while served < last:
        info = weights.wait_newer(after=served, timeout=120)
        try:
            w = weights.open(version=info.version)
        except FailedPreconditionError:
            continue  # saved over before we opened it: a newer one is published
        loaded = w.load_into(model, strict=False)
        logits, tokens = request(model)
        prev_intact = None
        if prev is not None:
            old, views, copies = prev
            prev_intact = all(torch.equal(views[n], copies[n]) for n in copies)
            del views
            old.close()
        views = w.state_dict()
        copies = {n: t.clone() for n, t in views.items()}
        prev = (w, views, copies)
        result = {"version": info.version, "tag": info.tag, "loaded": sorted(loaded),
                  "paths": w.paths, "logits": logits, "tokens": tokens, "prev_intact": prev_intact,
                  "pid": os.getpid()}
        tmp = os.path.join(out, f".v{info.version}.tmp")
        torch.save(result, tmp)
        os.rename(tmp, os.path.join(out, f"v{info.version}.pt"))  # whole or absent
        served = info.version


if __name__ == "__main__":
    main()
