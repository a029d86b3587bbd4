"""Wire codecs of the Tinker HTTP protocol (SDK 0.38.0): protobuf in, protobuf/JSON out.

The SDK sends `forward_backward` as the protobuf `ForwardBackwardRequest` of its own schema
(`tinker/proto/tinker_public_pb2.py`, which we import rather than copy, so the schema can
never drift from the pinned SDK) and insists on protobuf answers for `SampleResponse` and
`ForwardBackwardOutput`. Everything else is JSON shaped by the SDK's pydantic types.
This module turns those bytes into `tinker.types` objects for the engine and back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

_DTYPE_TO_NUMPY: dict[int, np.dtype] = {
    pb.DTYPE_FLOAT32: np.dtype(np.float32),
    pb.DTYPE_INT64: np.dtype(np.int64),
    pb.DTYPE_INT32: np.dtype(np.int32),
}
_DTYPE_TO_PUBLIC: dict[int, str] = {
    pb.DTYPE_FLOAT32: "float32",
    pb.DTYPE_INT64: "int64",
    pb.DTYPE_INT32: "int64",
}
_PUBLIC_TO_PROTO: dict[str, int] = {"float32": pb.DTYPE_FLOAT32, "int64": pb.DTYPE_INT64}
_STOP_REASON: dict[str, int] = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class WireError(ValueError):
    """A request body the server cannot decode; answered as a 400 with this message."""


@dataclass(frozen=True)
class ForwardBackwardCall:
    """A decoded `/api/v1/forward_backward` request."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str] | None
    forward_only: bool
    data: list[types.Datum]


def decode_forward_backward(body: bytes) -> ForwardBackwardCall:
    """A `forward_backward` body (protobuf, already decoded from any Content-Encoding by aiohttp, zstd
    included) as a ForwardBackwardCall; WireError when unreadable."""
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf raises DecodeError, a bare Exception subclass
        raise WireError(f"forward_backward body is not a ForwardBackwardRequest protobuf: {e}") from e
    if not msg.model_id:
        raise WireError("forward_backward request has no model_id")
    return ForwardBackwardCall(
        model_id=msg.model_id,
        seq_id=msg.seq_id,
        loss_fn=msg.loss_fn,
        loss_fn_config=_decode_loss_config(msg),
        forward_only=msg.forward_only,
        data=[_decode_datum(d, i) for i, d in enumerate(msg.data)],
    )


def _decode_loss_config(msg: pb.ForwardBackwardRequest) -> dict[str, float | str] | None:
    # Servers prefer v2 (numbers and strings); v1 is the float-only mirror older SDKs send.
    if msg.loss_fn_config_v2:
        config: dict[str, float | str] = {}
        for key, value in msg.loss_fn_config_v2.items():
            arm = value.WhichOneof("value")
            config[key] = value.text if arm == "text" else value.number
        return config
    if msg.loss_fn_config:
        return {key: float(v) for key, v in msg.loss_fn_config.items()}
    return None


def _decode_datum(msg: pb.Datum, index: int) -> types.Datum:
    chunks: list[types.ModelInputChunk] = []
    for chunk in msg.model_input:
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(
                f"datum {index}: {kind or 'empty'} model-input chunks are not supported "
                "(tinkrl's engine takes token chunks only)"
            )
        tokens = np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32)
        chunks.append(types.EncodedTextChunk(tokens=tokens.tolist()))
    inputs = {name: decode_tensor(t, f"datum {index} {name}") for name, t in msg.loss_fn_inputs.items()}
    return types.Datum(model_input=types.ModelInput(chunks=chunks), loss_fn_inputs=inputs)


def decode_tensor(msg: pb.Tensor, where: str) -> types.TensorData:
    """A protobuf Tensor (dense or sparse CSR) as TensorData; int32 arrives as int64."""
    np_dtype = _DTYPE_TO_NUMPY.get(msg.dtype)
    if np_dtype is None:
        raise WireError(f"{where}: unsupported tensor dtype {pb.DType.Name(msg.dtype)}")
    dtype = _DTYPE_TO_PUBLIC[msg.dtype]
    shape = list(msg.shape) or None
    if msg.HasField("sparse_csr"):
        csr = msg.sparse_csr
        values = np.frombuffer(csr.values, dtype=np_dtype).astype(dtype)
        return types.TensorData(
            data=values,
            dtype=dtype,  # type: ignore[arg-type]
            shape=shape,
            sparse_crow_indices=np.frombuffer(csr.crow_indices, dtype=np.int64).tolist(),
            sparse_col_indices=np.frombuffer(csr.col_indices, dtype=np.int64).tolist(),
        )
    values = np.frombuffer(msg.dense, dtype=np_dtype).astype(dtype)
    return types.TensorData(data=values, dtype=dtype, shape=shape)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- responses


def encode_forward_backward_output(out: types.ForwardBackwardOutput) -> bytes:
    """`ForwardBackwardOutput` as the SDK's protobuf: per-field batched tensors with byte offsets."""
    msg = pb.ForwardBackwardOutput(loss_fn_output_type=out.loss_fn_output_type or "ArrayRecord")
    for key, value in out.metrics.items():
        msg.metrics[key] = float(value)
    outputs = list(out.loss_fn_outputs)
    # One ArrayRecord per run of datums whose fields share dtype and trailing shape
    # (the SDK concatenates records; ragged trailing shapes need separate ones).
    start = 0
    while start < len(outputs):
        signature = _record_signature(outputs[start])
        end = start + 1
        while end < len(outputs) and _record_signature(outputs[end]) == signature:
            end += 1
        _add_record(msg, outputs[start:end])
        start = end
    return msg.SerializeToString()


def _as_array(td: types.TensorData) -> np.ndarray:
    arr = td.to_numpy()
    return np.asarray(arr, dtype=np.float32 if td.dtype == "float32" else np.int64)


def _record_signature(datum_out: Mapping[str, types.TensorData]) -> tuple:
    return tuple((name, td.dtype, tuple(_as_array(td).shape[1:])) for name, td in sorted(datum_out.items()))


def _add_record(msg: pb.ForwardBackwardOutput, outputs: list[Mapping[str, types.TensorData]]) -> None:
    record = msg.loss_fn_outputs.add(num_datums=len(outputs))
    for name in sorted(outputs[0]):
        arrays = [_as_array(o[name]) for o in outputs]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([a.nbytes for a in arrays])
        batched = record.fields[name]
        batched.dtype = _PUBLIC_TO_PROTO[outputs[0][name].dtype]
        batched.data = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
        batched.offsets = offsets.tobytes()
        batched.trailing_shape.extend(arrays[0].shape[1:])


def encode_sample_response(resp: types.SampleResponse) -> bytes:
    """A SampleResponse as the SDK's protobuf (packed arrays; a missing prompt logprob is NaN)."""
    msg = pb.SampleResponse(prompt_cache_hit_tokens=int(resp.prompt_cache_hit_tokens or 0))
    for seq in resp.sequences:
        seq_msg = msg.sequences.add(
            stop_reason=_STOP_REASON[seq.stop_reason],
            tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
        )
        if seq.logprobs is not None:
            seq_msg.logprobs = np.asarray(seq.logprobs, dtype=np.float32).tobytes()
        if seq.topk_logprobs_np is not None:
            _fill_topk(seq_msg.topk_sampled_logprobs, seq.topk_logprobs_np)
    if resp.prompt_logprobs is not None:
        values = [math.nan if lp is None else lp for lp in resp.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    if resp.topk_prompt_logprobs_np is not None:
        _fill_topk(msg.topk_prompt_logprobs, resp.topk_prompt_logprobs_np)
    return msg.SerializeToString()


def _fill_topk(msg: pb.TopkLogprobs, topk: types.TopkLogprobs) -> None:
    token_ids = np.asarray(topk.token_ids, dtype=np.int32)
    msg.length, msg.k = token_ids.shape
    msg.token_ids = token_ids.tobytes()
    msg.logprobs = np.asarray(topk.logprobs, dtype=np.float32).tobytes()


def mask_prompt_logprobs(resp: types.SampleResponse, last_n: int) -> types.SampleResponse:
    """Keep only the last `last_n` prompt logprobs (the SDK's `prompt_logprobs_last_n`)."""
    if resp.prompt_logprobs is None:
        return resp
    values = list(resp.prompt_logprobs)
    keep_from = max(len(values) - last_n, 0)
    masked = [None] * keep_from + values[keep_from:]
    array = np.asarray([math.nan if v is None else v for v in masked], dtype=np.float32)
    return types.SampleResponse(
        sequences=resp.sequences,
        prompt_logprobs_np=array,
        topk_prompt_logprobs_np=resp.topk_prompt_logprobs_np,
        prompt_cache_hit_tokens=resp.prompt_cache_hit_tokens,
    )


def to_json(obj: Any) -> Any:
    """A pydantic response model (or plain value) as the JSON the SDK validates."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json", exclude_none=True)
    return obj
