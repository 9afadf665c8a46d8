"""The Tinker SDK's binary wire format on the server side: its `forward_backward` requests and the results of
`forward_backward` and `sample` travel as protobuf (the SDK refuses those two results as JSON). The messages are
the SDK's own generated module (`tinker.proto`), so the server reads and writes exactly what the pinned SDK does;
every numeric array on that wire is raw little-endian bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from sleuth.core.errors import BadInput

TOPK_EMPTY_ID, TOPK_EMPTY_LOGPROB = 0, -99999.0  # the SDK reads a row that starts with this as "no top-k here"
_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


class WireError(BadInput):
    """A request the server cannot read: the message names what to change."""


@dataclass
class WireDatum:
    tokens: np.ndarray  # int64 (N,): the model input
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # loss_fn_inputs, each as sent (float32 / int64)


@dataclass
class ForwardBackwardRequest:
    model_id: str
    seq_id: int
    data: list[WireDatum]
    loss_fn: str
    config: dict[str, float | str]
    forward_only: bool


def decode_forward_backward(body: bytes, content_encoding: str | None) -> ForwardBackwardRequest:
    if content_encoding == "zstd":
        import zstandard

        body = zstandard.ZstdDecompressor().decompressobj().decompress(body)
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError
        raise WireError(f"forward_backward body is not a tinker_public.ForwardBackwardRequest: {e}") from e
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    return ForwardBackwardRequest(msg.model_id, msg.seq_id, [_datum(i, d) for i, d in enumerate(msg.data)],
                                  msg.loss_fn, config, msg.forward_only)


def _datum(i: int, d: pb.Datum) -> WireDatum:
    tokens: list[np.ndarray] = []
    for c in d.model_input:
        kind = c.WhichOneof("chunk")
        if kind != "encoded_text":
            raise WireError(f"datum {i}: a {kind} chunk in model_input; this server trains text models only "
                            "(send EncodedTextChunk)")
        tokens.append(np.frombuffer(c.encoded_text.tokens, dtype="<i4").astype(np.int64))
    ids = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
    return WireDatum(ids, {name: _tensor(f"datum {i}: loss_fn_inputs[{name!r}]", t)
                           for name, t in d.loss_fn_inputs.items()})


def _tensor(what: str, t: pb.Tensor) -> np.ndarray:
    dtype = _DTYPES.get(t.dtype)
    if dtype is None:
        raise WireError(f"{what}: dtype {pb.DType.Name(t.dtype)} is not float32, int64 or int32")
    shape = tuple(t.shape)
    if t.WhichOneof("encoding") == "sparse_csr":
        csr = t.sparse_csr
        if len(shape) != 2:
            raise WireError(f"{what}: a sparse tensor needs a 2-D shape, got {list(shape)}")
        values = np.frombuffer(csr.values, dtype=np.dtype(dtype).newbyteorder("<"))
        crow = np.frombuffer(csr.crow_indices, dtype="<i8")
        col = np.frombuffer(csr.col_indices, dtype="<i8")
        out = np.zeros(shape, dtype=dtype)
        for row in range(shape[0]):
            out[row, col[crow[row]:crow[row + 1]]] = values[crow[row]:crow[row + 1]]
        return out
    arr = np.frombuffer(t.dense, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    if shape and int(np.prod(shape)) != arr.size:
        raise WireError(f"{what}: {arr.size} values for shape {list(shape)}")
    return arr.reshape(shape) if shape else arr


def encode_forward_backward(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """One ArrayRecord holding every datum's float32 outputs (e.g. `logprobs`), each field's values concatenated
    with int64 byte offsets; metric keys are `name:reduction`, as the SDK merges them."""
    record = pb.ArrayRecord(type_tag="ArrayRecord", num_datums=len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.ascontiguousarray(o[name], dtype="<f4").ravel() for o in outputs]
        offsets = np.concatenate([[0], np.cumsum([a.nbytes for a in arrays])]).astype("<i8")
        record.fields[name].CopyFrom(pb.BatchedTensor(data=b"".join(a.tobytes() for a in arrays),
                                                      offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32))
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record])
    for k, v in metrics.items():
        out.metrics[k] = float(v)
    return out.SerializeToString()


@dataclass
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stopped: bool  # ended on a stop token or string (else at max_tokens)


def encode_sample(sequences: list[SampledSequence], prompt_logprobs: np.ndarray | None,
                  topk: tuple[np.ndarray, np.ndarray] | None) -> bytes:
    """`prompt_logprobs`: one float per prompt token, NaN at position 0. `topk`: (ids, logprobs), each
    (prompt length, k), rows without a top-k filled with the SDK's empty marker."""
    out = pb.SampleResponse()
    for s in sequences:
        out.sequences.append(pb.SampledSequence(
            stop_reason=pb.STOP_REASON_STOP if s.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(s.tokens, "<i4").tobytes(), logprobs=np.asarray(s.logprobs, "<f4").tobytes()))
    if prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(prompt_logprobs, "<f4").tobytes()
    if topk is not None:
        ids, lps = topk
        out.topk_prompt_logprobs.CopyFrom(pb.TopkLogprobs(
            token_ids=np.asarray(ids, "<i4").tobytes(), logprobs=np.asarray(lps, "<f4").tobytes(),
            k=ids.shape[1], length=ids.shape[0]))
    return out.SerializeToString()
