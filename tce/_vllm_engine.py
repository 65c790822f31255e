"""The ``tce`` weight-transfer engine inside each vLLM worker process (see
docs/weights.md, "In vLLM").

vLLM creates one per worker when the engine runs with
``weight_transfer_config={"backend": "tce"}`` (``register`` in
tce.vllm put it in vLLM's registry). The trainer's side never
sends tensors: ``update_weights({"version": N})`` names a published
version, and each worker reads it from its node's cache through
``tce.weights`` (a lease, and mappings of the cached bytes: workers of a
tensor-parallel engine map the same memory, each weight loader narrowing
the whole tensor to its shard).

Everything that can refuse an update happens before the model is touched:
the version must be published and leasable (not gone, not revoked), every
file must map, and its tensors must be exactly the model's (names, shapes,
and dtypes up to a float cast), as the checkpoint the engine started from
declares them. Only then does the layerwise reload run (vLLM's own, as its
checkpoint-format backends do: on CPU a linear layer's weight is packed at
load and the bare ``load_weights`` would find no tensor to copy into),
feeding ``load_weights`` in chunks of at most ``chunk_mib``. Should the load
itself fail half-way, the previous version (still leased) is loaded again,
so the engine keeps serving what it served.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
from typing import Any, Iterable, Iterator

import torch

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from tce import weights
from tce.core import _safetensors
from tce.errors import FailedPreconditionError, InvalidArgumentError

log = logging.getLogger("tce.vllm")

Signature = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclasses.dataclass
class TCEInitInfo(WeightTransferInitInfo):
    """``init_weight_transfer_engine``'s ``init_info`` for the tce backend."""

    job: str = ""
    socket: str | None = None          # the node's TCE socket (default: TCE_SOCKET, /run/tce/tce.sock)
    sources: list[str] | None = None   # peer endpoints to follow the job from (another node's trainer)
    lease_s: float | None = None       # the lease on the loaded version (default: the server's)
    chunk_mib: int = 64                # bytes handed to one load_weights call, at most

    def __post_init__(self) -> None:
        if not isinstance(self.job, str) or not self.job:
            raise ValueError("the tce backend's init_info needs 'job': the name of the trainer's job")
        if self.sources is not None and (not isinstance(self.sources, list)
                                         or not all(isinstance(s, str) and s for s in self.sources)):
            raise ValueError(f"'sources' must be a list of peer endpoints (host:port), got {self.sources!r}")
        if not isinstance(self.chunk_mib, int) or self.chunk_mib < 1:
            raise ValueError(f"'chunk_mib' must be a positive integer, got {self.chunk_mib!r}")


@dataclasses.dataclass
class TCEUpdateInfo(WeightTransferUpdateInfo):
    """``update_weights``' ``update_info``: the published version to load (0: the newest)."""

    version: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise ValueError(f"'version' must be a version number >= 0, got {self.version!r}")


class TCEWeightTransferEngine(WeightTransferEngine[TCEInitInfo, TCEUpdateInfo]):
    init_info_cls = TCEInitInfo
    update_info_cls = TCEUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._info: TCEInitInfo | None = None
        self._signature: Signature | None = None
        self._loaded: weights.Weights | None = None   # the version the model holds, leased

    # -- the session -----------------------------------------------------

    def init_transfer_engine(self, init_info: TCEInitInfo) -> None:
        import tce

        if init_info.socket:
            tce.configure(socket=init_info.socket)
        if init_info.sources:
            weights.follow(init_info.job, sources=init_info.sources)
        self._info = init_info
        if self._signature is None:
            self._signature = _files_signature(str(self.model_config.model))

    def start_weight_update(self) -> None:
        self._need_init()  # the model is touched in update_weights, once all is checked

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: TCEUpdateInfo) -> None:
        info = self._need_init()
        w = weights.open(info.job, update_info.version, lease_s=info.lease_s)
        try:
            # On a GPU, the kept mappings registered with CUDA: the loaders'
            # copies to the device run at pinned speed, not through a bounce.
            pinned = w.pinned_tensors() if self.device.type == "cuda" else None
            tensors = pinned if pinned is not None else list(w.tensors())
            got = self._check(w, tensors)
        except BaseException:
            w.close()
            raise
        try:
            self._load(tensors, info.chunk_mib)
        except BaseException as e:
            w.close()
            if not self._roll_back(e):
                raise RuntimeError(f"loading version {w.version} failed ({e}) and the version served "
                                   "before could not be loaded again: the engine's weights are "
                                   "incomplete") from e
            raise
        del tensors
        previous, self._loaded = self._loaded, w
        self._signature = self._signature or got
        if previous is not None:
            previous.close()
        log.info("tce: loaded version %d (%s) of job %r", w.version, w.info.tag, info.job)

    def finish_weight_update(self) -> None:
        pass  # the version was loaded whole (and processed) in update_weights

    def shutdown(self) -> None:
        if self._loaded is not None:
            self._loaded.close()
            self._loaded = None
        self._info = None

    # -- inside ------------------------------------------------------------

    def _need_init(self) -> TCEInitInfo:
        if self._info is None:
            raise RuntimeError("the tce weight-transfer backend is not initialised: call "
                               "init_weight_transfer_engine with {'job': ...} first")
        return self._info

    def _check(self, w: weights.Weights, tensors: list[tuple[str, torch.Tensor]]) -> Signature:
        """Refuse a version that is not this model's, naming what differs;
        returns its signature."""
        job = w.info.job
        if not tensors:
            raise FailedPreconditionError(f"version {w.version} of job {job!r} holds no weights")
        got = _signature(w.version, tensors)
        if self._signature is None:
            return got  # nothing to hold it against: the first version loaded sets it
        where = f"version {w.version} ({w.info.tag}) of job {job!r} is not this engine's model"
        missing = sorted(set(self._signature) - set(got))
        extra = sorted(set(got) - set(self._signature))
        if missing or extra:
            raise InvalidArgumentError(
                f"{where}: {len(missing)} weight(s) missing (e.g. {missing[:3]}), "
                f"{len(extra)} unknown (e.g. {extra[:3]})")
        for name, (shape, dtype) in got.items():
            want_shape, want_dtype = self._signature[name]
            if shape != want_shape:
                raise InvalidArgumentError(f"{where}: {name} has shape {list(shape)}, "
                                           f"the model's is {list(want_shape)}")
            if dtype != want_dtype and not (dtype.is_floating_point and want_dtype.is_floating_point):
                raise InvalidArgumentError(f"{where}: {name} is {dtype}, the model's is {want_dtype}")
        return got

    def _load(self, tensors: list[tuple[str, torch.Tensor]], chunk_mib: int) -> None:
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)
        for chunk in _chunks(tensors, chunk_mib << 20):
            self.model.load_weights(chunk)
        finalize_layerwise_reload(self.model, self.model_config)

    def _roll_back(self, cause: BaseException) -> bool:
        """The load failed after the model was touched: close the layerwise
        reload it left open (layers it never reached get their kernels back,
        half-loaded ones are processed as they are), then load the version
        the engine held before, which the lease kept intact, in a reload of
        its own."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        prev = self._loaded
        try:
            finalize_layerwise_reload(self.model, self.model_config)
        except BaseException as e:
            log.error("tce: closing the failed reload failed too (%s)", e)
        try:
            if prev is None:
                raise RuntimeError("no version was loaded through TCE before")
            prev.renew()  # raises when the lease is gone (its bytes may be too)
            self._load(list(prev.tensors()), self._need_init().chunk_mib)
        except BaseException as e:
            log.error("tce: loading failed (%s) and the previous weights could not be restored (%s): "
                      "the engine's weights are incomplete", cause, e)
            return False
        log.warning("tce: loading failed (%s); the engine serves version %d again", cause, prev.version)
        return True


def _signature(version: int, tensors: Iterable[tuple[str, torch.Tensor]]) -> Signature:
    sig: Signature = {}
    for name, t in tensors:
        if name in sig:
            raise FailedPreconditionError(f"version {version} names the weight {name} twice")
        sig[name] = (tuple(t.shape), t.dtype)
    return sig


def _files_signature(model: str) -> Signature | None:
    """The weights the engine's own checkpoint declares (its safetensors
    headers), or None where it has none here (a hub id, a dummy load)."""
    pattern = os.path.join(glob.escape(model), "*.safetensors")
    files = sorted(glob.glob(pattern)) if os.path.isdir(model) else []
    if not files:
        log.warning("tce: %s has no safetensors files here; the first version loaded is taken as "
                    "the model's signature, unchecked", model)
        return None
    sig: Signature = {}
    for f in files:  # the headers only, read and checked by TCE's own safetensors reader
        with open(f, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            first = fh.read(8)
            head = first + fh.read(_safetensors.header_size(first, size, source=f) - 8)
        header = _safetensors.read_header(head, file_size=size, source=f)
        sig.update((name, (t.shape, t.dtype)) for name, t in header.tensors.items())
    return sig


def _chunks(tensors: list[tuple[str, torch.Tensor]], limit: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive runs of ``tensors`` of at most ``limit`` bytes (a larger
    tensor alone)."""
    chunk: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append((name, t))
        size += n
    if chunk:
        yield chunk


__all__ = ["TCEInitInfo", "TCEUpdateInfo", "TCEWeightTransferEngine"]
