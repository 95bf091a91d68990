"""The teacher-forced replay (`domino_hf.training.teacher_forced`) is what greedy decoding does, step by step.

This is the contract between training and drafting: the context features, block masks, positions and the
head's teacher-forced correction the objective trains on give, at every anchor, the run that
`generate(assistant_model=draft)` accepts there. Tiny fp32 targets with drafts fitted to their answers, so
that runs are long and varied.
"""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_both, tiny_prompts

from domino_hf.training.teacher_forced import Replay, replay_answer, replay_steps

pytestmark = pytest.mark.usefixtures("single_thread")


def test_replay_steps_move_on_by_run_plus_one():
    assert replay_steps([]) == []
    assert replay_steps([0, 0, 0]) == [0, 1, 2]
    assert replay_steps([2, 9, 9, 1, 0, 0]) == [0, 3, 5]
    replay = Replay(runs=[3, 0, 0, 0, 0, 0], steps=replay_steps([3, 0, 0, 0, 0, 0]))
    assert replay.steps == [0, 4, 5]
    assert replay.tau == 2.0  # 6 decoded tokens in 3 verify steps
    assert replay.anchor_mean_tau == 1.5  # what training's sim_tau would say: biased here, too low


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_replay_equals_greedy_decoding_step_by_step(arch, fitted_pair):
    target, draft, prompts = fitted_pair(arch)
    draft.config.context_lookup_tokens = 0  # the block alone
    draft.config.draft_backoff = False  # draft every step
    n = draft.config.num_draft_tokens
    checked = accepted_total = 0
    for ids in prompts[:3] + tiny_prompts(2, length=6, seed=11):  # fitted prompts (long runs), then unseen
        output, stats = greedy_both(target, draft, ids, max_new_tokens=24)
        answer = output[0, ids.shape[1]:].tolist()
        replay = replay_answer(draft, target, ids[0].tolist(), answer)
        position = 0
        for drafted, accepted, source in zip(stats.drafted, stats.accepted, stats.sources):
            if source == "none":  # the last token: no room left for a draft
                assert position == len(replay.runs) - 1 and accepted == 0
            else:  # near max_new_tokens fewer drafts fit than the block holds
                assert source == "domino" and accepted == min(replay.runs[position], drafted), (position, replay.runs)
            position += accepted + 1
            checked += drafted == n
        assert position == len(replay.runs)  # every decoded token accounted for
        if all(d == n for d in stats.drafted):  # the answer ended (EOS) before max_new_tokens
            assert replay.steps == [sum(a + 1 for a in stats.accepted[:i]) for i in range(stats.num_steps)]
            assert replay.tau == pytest.approx((len(answer) - 1) / stats.num_steps)
        accepted_total += sum(stats.accepted)
    assert checked > 10 and accepted_total > 10  # real acceptance, not a run of zeros on both sides


def test_replay_of_a_one_token_answer_is_empty(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    replay = replay_answer(draft, target, prompts[0][0].tolist(), [3])
    assert replay.runs == [] and replay.steps == [] and replay.tau == 0.0


def test_replay_runs_stay_within_the_answer(fitted_pair):
    target, draft, prompts = fitted_pair("llama")
    with torch.no_grad():
        answer = target.generate(prompts[0], max_new_tokens=10, do_sample=False)[0, prompts[0].shape[1]:].tolist()
    replay = replay_answer(draft, target, prompts[0][0].tolist(), answer)
    assert len(replay.runs) == len(answer) - 1
    assert all(0 <= run <= min(draft.config.num_draft_tokens, len(answer) - 2 - i) for i, run in enumerate(replay.runs))
    assert sum(replay.runs[i] + 1 for i in replay.steps) == len(answer) - 1  # the last step ends on the last token


def test_training_probe_reports_decoding_and_replayed_tau(fitted_pair):
    """`domino train --probe-prompts`: both τ at each checkpoint; with the lookup off and drafting forced on
    every step the two agree, since the replay is what decoding does then."""
    from domino_hf.training.recipe import make_tau_probe

    target, draft, prompts = fitted_pair("llama")
    probe = make_tau_probe(target, prompts[:3], max_new_tokens=20)
    draft.train()
    shipped = probe(draft)
    assert set(shipped) == {"probe_tau", "probe_replay_tau"} and shipped["probe_replay_tau"] > 1.5
    assert draft.training  # the probe gives the draft back in training mode
    draft.config.context_lookup_tokens = 0
    draft.config.draft_backoff = False
    block_only = probe(draft)
    assert block_only["probe_tau"] == block_only["probe_replay_tau"], block_only
