"""A fault for tests/test_vllm.py, injected in a vLLM worker at the model's
``load_weights`` (``worker_extension_cls="vllm_faults.Faults"``): the next
update's load fails after some of its tensors went into the model, as a
load that dies half-way would (no real fault does this once every check
passed)."""

from __future__ import annotations


class Faults:
    def fail_next_load(self) -> None:
        model = self.model_runner.model
        real = model.load_weights

        def load_weights(weights):
            model.load_weights = real  # once: the roll-back loads for real

            def five_then_die():
                for i, item in enumerate(weights):
                    if i == 5:
                        raise RuntimeError("injected: the load died half-way")
                    yield item

            return real(five_then_die())

        model.load_weights = load_weights
