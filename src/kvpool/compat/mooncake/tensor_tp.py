"""Mooncake's tensor-parallel, safetensors and CUDA tensor calls (`TensorTpCalls`).

Tensor parallelism as Mooncake does it: `put_tensor_with_tp(key, t, tp_rank, tp_size,
split_dim)` cuts `t` along `split_dim` into `tp_size` equal shards (a dimension that does not
divide evenly is refused, -600) and stores every shard, whatever `tp_rank` says, as its own
object `<key>_tp_<rank>` in the SHARD layout (`encode_tp_shard_header`: the whole tensor's
shape, the shard's, one TP axis). `get_tensor_with_tp(key, tp_rank, tp_size)` reads
`<key>_tp_<tp_rank>` and answers that shard. With `tp_size <= 1` every call is its plain form
on `key` itself. The `_from` forms take the whole tensor as a registered `[TensorMetadata][data]`
buffer; the `_into` forms read a shard into registered memory.

`save_tensor_to_safetensor` / `load_tensor_from_safetensor` go through `safetensors.torch`
(installed separately); the CUDA calls (`get_tensor_into_cuda`, `batch_get_tensor_into_cuda`)
need a dummy client's CUDA IPC in Mooncake and answer -600 here, as the wheel does without one.
"""

from __future__ import annotations

import logging
from typing import Any

from kvpool.codes import FILE_NOT_FOUND, INVALID_PARAMS, OK, UNAVAILABLE_IN_CURRENT_STATUS
from kvpool.compat.mooncake.calls import check_key, check_keys, index, join_parts
from kvpool.compat.mooncake.replicate import ReplicateConfig
from kvpool.compat.mooncake.tensor import (
    DTYPE_CODES,
    HEADER_SIZE,
    TensorCalls,
    _torch,
    bytes_to_tensor,
    encode_tp_shard_header,
)

__all__ = ["TensorTpCalls", "tp_key", "tp_shards"]

log = logging.getLogger(__name__)


def tp_key(key: str, rank: int) -> str:
    """The object name of shard `rank` of `key` (Mooncake's `<key>_tp_<rank>`)."""
    return f"{key}_tp_{rank}"


def tp_shards(tensor: Any, tp_size: int, split_dim: int) -> list[tuple[bytes, memoryview]]:
    """(header, data) of each of the `tp_size` shards of `tensor` along `split_dim`.

    ValueError when the dimension does not exist, does not divide evenly, or the dtype has no
    Mooncake code; TypeError for something that is not a tensor."""
    torch = _torch()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise ValueError(f"dtype {name} has no Mooncake code")
    t = tensor.detach().to("cpu")
    shape = tuple(int(d) for d in t.shape)
    if tp_size <= 0 or not 0 <= split_dim < len(shape):
        raise ValueError(f"split_dim {split_dim} / tp_size {tp_size} for shape {shape}")
    if shape[split_dim] % tp_size:
        raise ValueError(
            f"dimension {split_dim} ({shape[split_dim]}) does not split into {tp_size} "
            "equal shards (Mooncake supports uniform sharding only)"
        )
    out = []
    extent = shape[split_dim]
    for rank in range(tp_size):
        start, end = extent * rank // tp_size, extent * (rank + 1) // tp_size
        shard = t.narrow(split_dim, start, end - start).contiguous()
        data = shard.reshape(-1).view(torch.uint8).numpy()
        local = tuple(int(d) for d in shard.shape)
        header = encode_tp_shard_header(name, shape, local, rank, tp_size, split_dim, data.nbytes)
        out.append((header, memoryview(data)))
    return out


class TensorTpCalls(TensorCalls):
    """The tensor-parallel, safetensors and CUDA calls (module docstring)."""

    # ------------------------------------------------------------------ put

    def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Store every shard of `tensor` as `<key>_tp_<rank>`; 0 or the first failure."""
        return self._put_tp(check_key(key), tensor, None, tp_size, split_dim, False)

    def pub_tensor_with_tp(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """put_tensor_with_tp with a ReplicateConfig."""
        return self._put_tp(check_key(key), tensor, config, tp_size, split_dim, True)

    def batch_put_tensor_with_tp(
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """put_tensor_with_tp per key; one code per base key."""
        return self._batch_put_tp(base_keys, tensors_list, None, tp_size, split_dim, False)

    def batch_pub_tensor_with_tp(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        return self._batch_put_tp(base_keys, tensors_list, config, tp_size, split_dim, True)

    def put_tensor_with_tp_from(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """The whole tensor from registered `[TensorMetadata][data]` bytes, stored as shards."""
        k, ptr, n = check_key(key), index(buffer_ptr), index(size)
        if n < HEADER_SIZE:
            log.error("put_tensor_with_tp_from %r: %d bytes cannot hold a tensor header", k, n)
            return INVALID_PARAMS
        if tp_size <= 1:
            return self.put_tensor_from(k, ptr, n)
        if self._store is None:
            return UNAVAILABLE_IN_CURRENT_STATUS  # as every call before setup()
        mv = self._pointers.find(ptr, n)
        tensor = None if mv is None else bytes_to_tensor(mv)
        if tensor is None:
            log.error("put_tensor_with_tp_from %r: not a registered tensor object", k)
            return INVALID_PARAMS
        return self._put_tp(k, tensor, None, tp_size, split_dim, False)

    def batch_put_tensor_with_tp_from(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        ks = check_keys(base_keys)
        if tp_size <= 1:
            return self.batch_put_tensor_from(ks, buffer_ptrs, sizes)
        if not len(ks) == len(buffer_ptrs) == len(sizes):
            return [INVALID_PARAMS] * len(ks)
        return [
            self.put_tensor_with_tp_from(k, p, n, tp_rank, tp_size, split_dim)
            for k, p, n in zip(ks, buffer_ptrs, sizes, strict=True)
        ]

    def _put_tp(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None,
        tp_size: int,
        split_dim: int,
        pub: bool,
    ) -> int:
        tp_size, split_dim = index(tp_size), index(split_dim)
        if tp_size <= 1:
            return self.pub_tensor(key, tensor, config) if pub else self.put_tensor(key, tensor)
        try:
            shards = tp_shards(tensor, tp_size, split_dim)
        except (ImportError, TypeError, ValueError) as exc:
            log.error("put_tensor_with_tp %r: %s", key, exc)
            return INVALID_PARAMS
        for rank, (header, data) in enumerate(shards):
            code = self._put(tp_key(key, rank), join_parts((header, data)), config, False)
            if code != OK:
                return code
        return OK

    def _batch_put_tp(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        base_keys: list[str],
        tensors_list: list[Any],
        config: ReplicateConfig | None,
        tp_size: int,
        split_dim: int,
        pub: bool,
    ) -> list[int]:
        ks = check_keys(base_keys)
        if len(ks) != len(tensors_list):
            return [INVALID_PARAMS] * len(ks)
        return [
            self._put_tp(k, t, config, tp_size, split_dim, pub)
            for k, t in zip(ks, tensors_list, strict=True)
        ]

    # ------------------------------------------------------------------ get

    def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        """Shard `tp_rank` of `key` (its local part), or None."""
        k = check_key(key)
        return self.get_tensor(k if index(tp_size) <= 1 else tp_key(k, index(tp_rank)))

    def batch_get_tensor_with_tp(
        self, base_keys: list[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        ks = check_keys(base_keys)
        if index(tp_size) <= 1:
            return self.batch_get_tensor(ks)
        return self.batch_get_tensor([tp_key(k, index(tp_rank)) for k in ks])

    def get_tensor_with_tp_into(  # noqa: PLR0917  (Mooncake's positional signature)
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        """Shard `tp_rank` of `key` read into registered memory; the tensor viewing it, or
        None."""
        k = check_key(key)
        name = k if index(tp_size) <= 1 else tp_key(k, index(tp_rank))
        return self.get_tensor_into(name, buffer_ptr, size)

    def batch_get_tensor_with_tp_into(
        self,
        base_keys: list[str],
        buffer_ptrs: list[int],
        sizes: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        ks = check_keys(base_keys)
        if index(tp_size) > 1:
            ks = [tp_key(k, index(tp_rank)) for k in ks]
        return self.batch_get_tensor_into(ks, buffer_ptrs, sizes)

    # ------------------------------------------------------------------ CUDA

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """-600: reading into a CUDA tensor needs Mooncake's dummy client with CUDA IPC, which
        kvpool does not have (the wheel answers the same without one). Read with
        `get_tensor` / `get_tensor_into` and copy to the device."""
        check_key(key)
        log.error(
            "get_tensor_into_cuda: CUDA IPC reads need a dummy client; use get_tensor_into and "
            "copy to the device"
        )
        return INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys: list[str], tensors_list: list[Any]) -> list[int]:
        ks = check_keys(keys)
        log.error("batch_get_tensor_into_cuda: CUDA IPC reads need a dummy client")
        return [INVALID_PARAMS] * len(ks)

    # ------------------------------------------------------------------ safetensors

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Write the tensor under `key` to a safetensors file (named `file_name`, else `key`),
        as the entry `key`; 0, -1100 (FILE_NOT_FOUND) when there is no tensor under `key`,
        -600 when the file cannot be written or safetensors is missing."""
        k = check_key(key)
        if self._store is None:
            return UNAVAILABLE_IN_CURRENT_STATUS  # as every call before setup()
        tensor = self.get_tensor(k)
        if tensor is None:
            log.error("save_tensor_to_safetensor: no tensor under %r", k)
            return FILE_NOT_FOUND
        try:
            from safetensors.torch import save_file

            save_file({k: tensor.clone()}, k if file_name is None else str(file_name))
        except Exception as exc:
            log.error("save_tensor_to_safetensor %r: %s", k, exc)
            return INVALID_PARAMS
        return OK

    def load_tensor_from_safetensor(
        self, key: str | None = None, file_name: str | None = None
    ) -> Any:
        """Store a tensor of a safetensors file under `key` (else under `file_name`) and answer
        it: the entry named `key` if the file has one, else its first entry; None on failure."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing required argument 'file_name'")
        target = str(file_name) if key is None else check_key(key)
        if self._store is None:
            log.error("load_tensor_from_safetensor: the store is not set up")
            return None
        try:
            from safetensors.torch import load_file

            loaded = load_file(str(file_name))
        except Exception as exc:
            log.error("load_tensor_from_safetensor %r: %s", file_name, exc)
            return None
        if not loaded:
            log.error("load_tensor_from_safetensor: no tensor in %r", file_name)
            return None
        if key is not None and target not in loaded:
            log.warning("load_tensor_from_safetensor: %r not in %r; using its first entry",
                        target, file_name)  # fmt: skip
        tensor = loaded[target] if target in loaded else next(iter(loaded.values()))
        code = self.put_tensor(target, tensor)
        if code != OK:
            log.error("load_tensor_from_safetensor: storing %r answered %d", target, code)
            return None
        return tensor
