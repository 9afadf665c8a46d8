"""The Tinker server's wire format against the pinned SDK's own code: what the SDK encodes, the server decodes,
and what the server encodes, the SDK decodes (tinker.proto.request_conv / response_conv). A bump of the `tinker`
pin that changes the protocol fails here first."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("tinker")

import tinker  # noqa: E402
from tinker import types  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response  # noqa: E402

from sleuth.servers.tinker.service import SDK_VERSION  # noqa: E402
from sleuth.servers.tinker.wire import (  # noqa: E402
    SampledSequence,
    WireError,
    decode_forward_backward,
    encode_forward_backward,
    encode_sample,
)


def test_the_installed_sdk_is_the_one_the_server_speaks():
    assert tinker.__version__ == SDK_VERSION


def _request(data, loss_fn="ppo", config=None):
    fb = types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config)
    return forward_backward_request_to_proto(types.ForwardBackwardRequest(
        forward_backward_input=fb, model_id="s:train:0", seq_id=3)).SerializeToString()


def test_the_server_reads_what_the_sdk_sends():
    datum = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7]),
                        loss_fn_inputs={"target_tokens": types.TensorData.from_torch(torch.tensor([6, 7, 8])),
                                        "advantages": types.TensorData.from_torch(torch.tensor([0.0, 1.5, -2.0]))})
    req = decode_forward_backward(_request([datum], config={"clip_low_threshold": 0.7, "tag": "x"}), None)
    assert (req.model_id, req.seq_id, req.loss_fn, req.forward_only) == ("s:train:0", 3, "ppo", False)
    assert req.config == {"clip_low_threshold": pytest.approx(0.7), "tag": "x"}
    d = req.data[0]
    assert d.tokens.tolist() == [5, 6, 7] and d.inputs["target_tokens"].tolist() == [6, 7, 8]
    assert d.inputs["target_tokens"].dtype == np.int64 and d.inputs["advantages"].tolist() == [0.0, 1.5, -2.0]


def test_a_body_that_is_not_the_message_is_refused_in_one_line():
    with pytest.raises(WireError, match="not a tinker_public.ForwardBackwardRequest"):
        decode_forward_backward(b"\xff\xff\xff", None)


def test_the_sdk_reads_what_the_server_sends():
    out = encode_forward_backward([{"logprobs": np.array([-1.0, -2.5, -0.25])}, {"logprobs": np.array([-3.0])}],
                                  {"loss:sum": 6.75})
    fb = deserialize_forward_backward_output(out)
    assert fb.metrics == {"loss:sum": 6.75}
    assert [o["logprobs"].tolist() for o in fb.loss_fn_outputs] == [[-1.0, -2.5, -0.25], [-3.0]]
    prompt_lp = np.array([np.nan, -1.5, -0.5], dtype=np.float32)
    topk = (np.array([[0, 0], [4, 9], [7, 0]], dtype=np.int32),
            np.array([[-99999.0, -99999.0], [-0.1, -2.0], [-0.2, -99999.0]], dtype=np.float32))
    sr = deserialize_sample_response(encode_sample([SampledSequence([3, 4], [-0.5, -1.0], True),
                                                    SampledSequence([8], [-2.0], False)], prompt_lp, topk))
    assert [(s.tokens, s.stop_reason) for s in sr.sequences] == [([3, 4], "stop"), ([8], "length")]
    assert sr.sequences[0].logprobs == [-0.5, -1.0]
    assert sr.prompt_logprobs[0] is None and sr.prompt_logprobs[1:] == [-1.5, -0.5]
    assert sr.topk_prompt_logprobs[0] is None
    assert sr.topk_prompt_logprobs[1] == [(4, pytest.approx(-0.1)), (9, -2.0)]
    assert sr.topk_prompt_logprobs[2] == [(7, pytest.approx(-0.2))] and not math.isnan(sr.prompt_logprobs[2])
