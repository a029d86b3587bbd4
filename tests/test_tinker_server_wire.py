"""The server's protobuf codecs against the SDK's own encoder and decoder (tinker 0.38.0)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import zstandard
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from tinkrl.tinker_server import wire


def _request(data, loss_fn="ppo", config=None):
    req = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id="s:train:0",
        seq_id=7,
    )
    msg = forward_backward_request_to_proto(req)
    msg.forward_only = True
    return msg.SerializeToString()


def test_forward_backward_request_round_trips_through_the_sdk_encoder():
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={
            "target_tokens": [6, 7, 8, 9],
            "logprobs": [0.0, -1.25, -2.5, -0.5],
            "advantages": [0.0, 1.0, 1.0, 1.0],
        },
    )
    body = _request([datum, datum], config={"clip_low_threshold": 0.7, "clip_high_threshold": 1.3})
    for payload in (body,):
        call = wire.decode_forward_backward(payload)
        assert (call.model_id, call.seq_id, call.loss_fn, call.forward_only) == ("s:train:0", 7, "ppo", True)
        assert call.loss_fn_config == pytest.approx({"clip_low_threshold": 0.7, "clip_high_threshold": 1.3})
        assert len(call.data) == 2
        got = call.data[1]
        assert got.model_input.to_ints() == [5, 6, 7, 8]
        assert got.loss_fn_inputs["target_tokens"].dtype == "int64"
        assert got.loss_fn_inputs["target_tokens"].tolist() == [6, 7, 8, 9]
        assert got.loss_fn_inputs["logprobs"].tolist() == [0.0, -1.25, -2.5, -0.5]


def test_string_loss_config_and_garbage_bodies():
    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]})
    call = wire.decode_forward_backward(_request([datum], "cross_entropy", {"mode": "x", "beta": 0.5}))
    assert call.loss_fn_config == {"mode": "x", "beta": 0.5}
    with pytest.raises(wire.WireError, match="not a ForwardBackwardRequest"):
        wire.decode_forward_backward(b"\xff\xff\xff")


@pytest.mark.parametrize("encoding", ["zstd", "gzip", None])
def test_the_server_reads_compressed_forward_backward_bodies(encoding):
    """A body in any Content-Encoding aiohttp decodes reaches the decoder as protobuf: the request is read
    (here, for a model the server does not know: 404); a body that does not decode is a 400, never a 500."""
    import gzip

    import httpx

    from tinkrl.tinker_server.app import serve_in_thread

    datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]})
    body = _request([datum], "cross_entropy")
    compress = {"zstd": zstandard.ZstdCompressor().compress, "gzip": gzip.compress, None: bytes}[encoding]
    headers = {"X-API-Key": "tml-local", "Content-Type": "application/x-protobuf"}
    if encoding:
        headers["Content-Encoding"] = encoding
    with serve_in_thread(None) as url:
        sent = httpx.post(url + "/api/v1/forward_backward", content=compress(body), headers=headers)
        assert sent.status_code == 404 and "unknown model_id 's:train:0'" in sent.text, sent.text
        if encoding:
            broken = httpx.post(url + "/api/v1/forward_backward", content=b"not compressed", headers=headers)
            assert broken.status_code == 400 and "failed inside tinkrl" not in broken.text, broken.text


def test_forward_backward_output_decodes_with_the_sdk_including_ragged_trailing_shapes():
    outs = [
        {"logprobs": types.TensorData(data=np.array([-1.0, -2.0, -3.0], np.float32), dtype="float32", shape=[3])},
        {"logprobs": types.TensorData(data=np.array([-0.5], np.float32), dtype="float32", shape=[1])},
        {"logprobs": types.TensorData(data=np.arange(6, dtype=np.float32), dtype="float32", shape=[3, 2])},
    ]
    sent = types.ForwardBackwardOutput(
        loss_fn_output_type="ArrayRecord", loss_fn_outputs=outs, metrics={"loss:sum": 4.5, "n:mean": 1.0}
    )
    got = deserialize_forward_backward_output(wire.encode_forward_backward_output(sent))
    assert got.metrics == {"loss:sum": 4.5, "n:mean": 1.0}
    assert [o["logprobs"].tolist() for o in got.loss_fn_outputs[:2]] == [[-1.0, -2.0, -3.0], [-0.5]]
    assert got.loss_fn_outputs[2]["logprobs"].shape == [3, 2]
    assert np.array_equal(got.loss_fn_outputs[2]["logprobs"].to_numpy().reshape(3, 2), np.arange(6).reshape(3, 2))


def test_sample_response_decodes_with_the_sdk_and_keeps_missing_prompt_logprobs_missing():
    seq = types.SampledSequence(
        stop_reason="stop",
        sequence_id="x",
        tokens_np=np.array([4, 5], np.int32),
        logprobs_np=np.array([-0.25, -0.75], np.float32),
    )
    sent = types.SampleResponse(sequences=[seq, seq], prompt_logprobs_np=np.array([np.nan, -1.5, -2.0], np.float32))
    got = deserialize_sample_response(wire.encode_sample_response(sent))
    assert [s.tokens for s in got.sequences] == [[4, 5], [4, 5]]
    assert got.sequences[0].logprobs == [-0.25, -0.75]
    assert got.sequences[0].stop_reason == "stop"
    assert got.prompt_logprobs == [None, -1.5, -2.0]

    masked = wire.mask_prompt_logprobs(sent, last_n=1)
    assert masked.prompt_logprobs[:2] == [None, None] and masked.prompt_logprobs[2] == -2.0
    assert not math.isnan(masked.prompt_logprobs_np[2])
