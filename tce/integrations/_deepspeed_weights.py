"""ZeRO-3 weights in each DeepSpeed checkpoint (``"tce": {"consolidate_weights": true}``).

Under ZeRO-3 a checkpoint's model-states files hold a placeholder for each
parameter: the weights exist only as partitions in the ranks' optimizer
states. So that a published version holds weights ``tce.weights`` can read,
the engine's wrapper of ``DeepSpeedEngine._save_checkpoint`` calls
:func:`save_consolidated` after DeepSpeed saved the model states and before
the tag is committed: every rank takes part in gathering the parameters
(DeepSpeed's ``_zero3_consolidated_16bit_state_dict``, what
``save_16bit_model`` saves, one layer at a time), and rank 0 saves the
result through the checkpoint engine as ``<save_dir>/<tag>/pytorch_model.bin``,
a file of the tag like the others.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger("tce.deepspeed")

FILENAME = "pytorch_model.bin"  # save_16bit_model's default name


def wanted(ds_engine: Any) -> bool:
    """Whether this save should carry the consolidated weights: a TCE engine
    asked for them, and the parameters are partitioned (ZeRO-3)."""
    engine = getattr(ds_engine, "checkpoint_engine", None)
    return bool(getattr(engine, "consolidate_weights", False)) and \
        bool(ds_engine.zero_optimization_partition_weights())


def save_consolidated(ds_engine: Any, save_dir: str, tag: str, exclude_frozen: bool) -> str | None:
    """Gather the parameters (a collective: every rank calls it) and save
    them whole on rank 0 in the tag's directory. Returns the path on rank 0,
    None on the others."""
    state = ds_engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=exclude_frozen)
    if state is None:  # not rank 0: gathered for it
        return None
    path = os.path.join(save_dir, str(tag), FILENAME)
    log.info("saving the consolidated ZeRO-3 weights of %s to %s", tag, path)
    ds_engine.checkpoint_engine.save(state, path)
    return path
