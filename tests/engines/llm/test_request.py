"""Request, SamplingParams and the request state machine."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.engines.llm.core.request import InvalidTransitionError, Request, RequestStatus, SamplingParams

S = RequestStatus

# The lifecycle the scheduler relies on, written out independently of the module's own table.
LEGAL_EDGES = {
    (S.WAITING, S.RUNNING),
    (S.WAITING, S.FINISHED_ABORTED),
    (S.RUNNING, S.PREEMPTED),
    (S.RUNNING, S.FINISHED_STOPPED),
    (S.RUNNING, S.FINISHED_LENGTH),
    (S.RUNNING, S.FINISHED_ABORTED),
    (S.PREEMPTED, S.RUNNING),
    (S.PREEMPTED, S.FINISHED_ABORTED),
    (S.WAITING, S.FINISHED_ERROR),  # its grammar did not compile (structured output)
    (S.RUNNING, S.FINISHED_ERROR),  # its grammar matcher failed
}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(S, S)))
def test_only_the_lifecycle_edges_are_allowed(source: RequestStatus, target: RequestStatus) -> None:
    request = Request("r", [1, 2, 3], status=source)
    if (source, target) in LEGAL_EDGES:
        request.move_to(target)
        assert request.status == target
    else:
        with pytest.raises(InvalidTransitionError, match=f"{source.name} -> {target.name}"):
            request.move_to(target)
        assert request.status == source


def test_finished_means_past_preempted() -> None:
    assert [s for s in S if S.is_finished(s)] == [S.FINISHED_STOPPED, S.FINISHED_LENGTH, S.FINISHED_ABORTED,
                                                  S.FINISHED_ERROR]
    assert Request("r", [1], status=S.FINISHED_LENGTH).is_finished
    assert not Request("r", [1], status=S.PREEMPTED).is_finished


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": "7"}, "seed"),
        ({"stop_token_ids": (2, -1)}, "stop_token_ids"),
        ({"stop": "###"}, "stop"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_sampling_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_accept_lists_from_config_files() -> None:
    params = SamplingParams(max_tokens=3, temperature=0.7, top_k=40, top_p=0.9, seed=1,
                            stop_token_ids=[2, 3], stop=["\n\n"])  # fmt: skip
    assert params.stop_token_ids == (2, 3) and params.stop == ("\n\n",)


@pytest.mark.parametrize(
    ("request_id", "prompt", "message"),
    [("", [1], "request_id"), ("r", [], "empty"), ("r", [1, -2], "token ids"), ("r", [1, "a"], "token ids")],
)
def test_bad_requests_are_rejected(request_id: str, prompt: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Request(request_id, prompt)


def test_sizes_follow_prompt_and_output() -> None:
    request = Request("r", [5, 6, 7], SamplingParams(max_tokens=4))
    request.output_token_ids.extend([8, 9])
    assert (request.num_prompt_tokens, request.num_output_tokens, request.num_tokens) == (3, 2, 5)
    assert request.all_token_ids == [5, 6, 7, 8, 9]
    assert request.max_num_tokens == 7


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    output=st.lists(st.integers(0, 50), max_size=12),
    data=st.data(),
)
def test_token_ids_in_is_a_slice_of_all_tokens(
    prompt: list[int], output: list[int], data: st.DataObject
) -> None:
    request = Request("r", prompt)
    request.output_token_ids.extend(output)
    total = len(prompt) + len(output)
    start = data.draw(st.integers(0, total))
    end = data.draw(st.integers(start, total))
    assert request.token_ids_in(start, end) == (prompt + output)[start:end]
