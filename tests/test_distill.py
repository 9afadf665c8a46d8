"""On-policy distillation: the reverse-KL penalty and the top-k divergences against hand-computed values and
gradients, through the real update on a DeepSpeed engine; the teacher's scoring (privileged context reaches the
teacher only); the config and the teacher's refusals."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from sleuth.agents.trajectory import Trajectory, Turn
from sleuth.core.errors import ConfigError
from sleuth.training.config import load_config
from sleuth.training.distill.signal import DistillConfig, TeacherTokens, reverse_kl_penalty, topk_divergence


# -- the math -----------------------------------------------------------------------------------------
def test_reverse_kl_penalty_sums_over_later_policy_tokens_only():
    # one row: prompt (0), two policy tokens, an env reply (0, 0), one policy token, padding
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 0]], dtype=torch.float32)
    student = torch.tensor([[0.0, -1.0, -2.0, -9.0, -9.0, -0.5, 0.0]])
    teacher = torch.tensor([[5.0, -1.5, -1.0, 3.0, 3.0, -0.25, 0.0]])
    # d = s − t on the mask: 0.5, −1.0, −0.25; nothing anywhere else
    assert reverse_kl_penalty(student, teacher, mask, 0.0).tolist() == [[0, 0.5, -1.0, 0, 0, -0.25, 0]]
    # γ = 0.5 counts policy tokens, not positions: the env reply between them is no step
    # t=5: −0.25; t=2: −1 + 0.5·(−0.25) = −1.125; t=1: 0.5 + 0.5·(−1.125) = −0.0625
    got = reverse_kl_penalty(student, teacher, mask, 0.5)
    assert got[0].tolist() == pytest.approx([0, -0.0625, -1.125, 0, 0, -0.25, 0])
    assert not got.requires_grad


def _forward_kl_by_hand(ps: list[float], pt: list[float]) -> float:
    ts, tt = 1 - sum(ps), 1 - sum(pt)
    return sum(b * math.log(b / a) for a, b in zip(ps, pt, strict=True)) + tt * math.log(tt / ts)


def test_topk_forward_kl_keeps_the_tail_as_a_bucket():
    ps, pt = [0.5, 0.2], [0.6, 0.3]
    student = torch.tensor([ps]).log().requires_grad_(True)
    teacher = torch.tensor([pt]).log()
    kl = topk_divergence(student, teacher, "topk_forward_kl")
    # 0.6 ln(0.6/0.5) + 0.3 ln(0.3/0.2) + 0.1 ln(0.1/0.3)
    assert float(kl.detach()) == pytest.approx(_forward_kl_by_hand(ps, pt), rel=1e-5)
    assert float(kl.detach()) == pytest.approx(0.12117, abs=1e-4)
    kl.sum().backward()
    # ∂/∂ log p_S(i) = −p_T(i) + p_T(tail)·p_S(i)/p_S(tail): the tail term pulls mass out of the tail too
    expected = [-pt[i] + 0.1 * ps[i] / 0.3 for i in range(2)]
    assert student.grad[0].tolist() == pytest.approx(expected, rel=1e-5)
    # a divergence: 0 where the two agree on the ids and the tail, > 0 where only the renormalised parts agree
    assert float(topk_divergence(teacher, teacher, "topk_forward_kl")) == pytest.approx(0.0, abs=1e-7)
    same_shape = torch.tensor([[0.3, 0.15]]).log()  # teacher's top-k halved: renormalised it is the teacher's
    assert float(topk_divergence(same_shape, torch.tensor([[0.6, 0.3]]).log(), "topk_forward_kl")) > 0.1


def test_jsd_against_its_definition():
    ps, pt, beta = [0.5, 0.2, 0.3], [0.6, 0.3, 0.1], 0.3  # with the tail bucket as the third entry
    m = [beta * b + (1 - beta) * a for a, b in zip(ps, pt, strict=True)]
    by_hand = beta * sum(b * math.log(b / c) for b, c in zip(pt, m, strict=True)) + \
        (1 - beta) * sum(a * math.log(a / c) for a, c in zip(ps, m, strict=True))
    got = topk_divergence(torch.tensor([ps[:2]]).log(), torch.tensor([pt[:2]]).log(), "jsd", beta)
    assert float(got) == pytest.approx(by_hand, rel=1e-5)
    flipped = topk_divergence(torch.tensor([ps[:2]]).log(), torch.tensor([pt[:2]]).log(), "jsd", 1 - beta)
    assert float(flipped) != pytest.approx(by_hand, rel=1e-3)  # β weights the teacher, not the student


# -- the config -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("over, match", [
    ({"algorithm.estimator": "none"}, "nothing to learn from"),
    ({"algorithm.distill.teacher": "self"}, "without teacher_context"),
    ({"algorithm.distill.teacher": "smollm2", "algorithm.distill.kind": "kl"}, "kind must be one of"),
    ({"algorithm.distill.teacher": "smollm2", "algorithm.distill.at": "rollout"}, "at must be one of"),
    ({"algorithm.distill.teacher": "smollm2", "algorithm.distill.teacher_context": "docs"}, "teacher_context must"),
    ({"algorithm.distill.teacher": "smollm2", "algorithm.estimator": "none", "rollout.zero_variance": "drop"},
     "zero_variance drop"),
    ({"algorithm.distill.teacher": "smollm2", "algorithm.distill.teacher_device": "gpu"}, "auto or cpu"),
    ({"algorithm.distill.teacher": "self", "algorithm.distill.teacher_context": "answer",
      "algorithm.distill.teacher_device": "cpu"}, "moves a local teacher model"),
])
def test_config_refuses_what_cannot_learn(over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=over)


def test_shipped_recipes_load():
    pure, mixed = load_config("docread_opd"), load_config("docread_opd_cigpo")
    assert pure.algorithm.estimator == "none" and pure.algorithm.distill.teacher == "self"
    assert mixed.algorithm.estimator == "info_gain" and mixed.algorithm.distill.teacher_context == "supporting"
    assert load_config(overrides={"algorithm.distill.teacher": "self", "algorithm.distill.teacher_context": "answer",
                                  "algorithm.estimator": "none", "rollout.group_size": 1}).rollout.group_size == 1


# -- the update -----------------------------------------------------------------------------------------
def _two_turn(prompt: list[int], a1: list[int], obs: list[int], a2: list[int], task_id: str = "t0") -> Trajectory:
    return Trajectory(task_id, "env", prompt, turns=[Turn(a1, [-1.0] * len(a1), "a", observation_ids=obs),
                                                     Turn(a2, [-1.0] * len(a2), "b")], group="g")


def _hand_logprobs(module, traj: Trajectory, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-softmax rows at the positions that predict each policy token, the policy tokens), with grad."""
    ids = torch.tensor([traj.token_ids()])
    mask = torch.tensor(traj.loss_mask(), dtype=torch.bool)
    logits = module(input_ids=ids).logits[0].float() / temperature
    rows = torch.log_softmax(logits[:-1], dim=-1)[mask[1:]]
    return rows, ids[0, 1:][mask[1:]]


def _grads_of_update(engine, updater, trajs, advs, teacher):
    captured = {}
    step = engine.step

    def capture():
        captured.update({n: p.grad.detach().clone() for n, p in engine.module.named_parameters()
                         if p.grad is not None})
        step()

    engine.step = capture
    stats = updater.update(trajs, advs, teacher)
    engine.step = step
    return captured, stats


@pytest.mark.parametrize("kind", ["reverse_kl", "topk_forward_kl"])
def test_update_gradient_equals_the_hand_computed_one(tiny_model_dir, kind):
    """The real update (ZeRO-0 engine, T = 0.7, packed rows, an estimator advantage beside the teacher's) has the
    gradient of the objective written out by hand: a wrong sign, temperature, detach or token set fails it."""
    from train_helpers import seeded_engine

    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig

    temperature, coef, k = 0.7, 0.5, 3
    engine = seeded_engine(tiny_model_dir, zero_stage=0, lr=0.0)
    cfg = DistillConfig(teacher="smollm2", coef=coef, kind=kind, top_k=k)
    updater = PolicyUpdater(engine, UpdateConfig(), LossConfig(), 0, temperature=temperature, distill=cfg)
    trajs = [_two_turn([11, 12, 13], [21, 22], [31, 32, 33], [41, 42, 43]),
             _two_turn([11, 12, 14], [23], [34], [44, 45])]
    advs = [np.array([0.3] * 5), np.array([-0.2] * 3)]
    gen = torch.Generator().manual_seed(0)
    teacher = []
    for t in trajs:
        n = len(t.token_ids())
        mask = torch.tensor(t.loss_mask(), dtype=torch.float32)
        lp = -torch.rand(n, generator=gen) * 3 * mask
        ids = torch.stack([torch.randperm(400, generator=gen)[:k] for _ in range(n)]) * mask.long()[:, None]
        tk = torch.log_softmax(torch.randn(n, k + 2, generator=gen), -1)[:, :k] * mask[:, None]
        teacher.append(TeacherTokens(lp, mask.clone(), torch.zeros(n, dtype=torch.long), ids, tk))
    grads, stats = _grads_of_update(engine, updater, trajs, advs, teacher)

    module = engine.module
    module.zero_grad()
    total, n_tokens = 0.0, sum(t.num_policy_tokens for t in trajs)
    for t, a, te in zip(trajs, advs, teacher, strict=True):
        rows, targets = _hand_logprobs(module, t, temperature)
        lp = rows.gather(-1, targets[:, None]).squeeze(-1)
        m = torch.tensor(t.loss_mask(), dtype=torch.bool)
        adv = torch.tensor(a, dtype=torch.float32)
        if kind == "reverse_kl":  # A − λ(log π_s − log π_T), the penalty a constant
            adv = adv - coef * (lp.detach() - te.logprobs[m])
            total = total + (-adv * lp).sum()  # the PPO surrogate's gradient at ratio 1
        else:
            total = total + (-adv * lp).sum()
            ps = rows.gather(-1, te.topk_ids[m]).exp()
            pt = te.topk_logprobs[m].exp()
            ts, tt = 1 - ps.sum(-1), 1 - pt.sum(-1)
            kl = (pt * (pt.log() - ps.log())).sum(-1) + tt * (tt.log() - ts.log())
            total = total + coef * kl.sum()
    (total / n_tokens).backward()
    for name, p in module.named_parameters():
        assert float((grads[name] - p.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-9, name
    assert len(stats.distill_kl) == n_tokens and stats.distill_signal == [1.0] * n_tokens


def test_at_current_is_exactly_zero_for_the_student_itself_and_behaviour_reads_the_engine(tiny_model_dir):
    from train_helpers import seeded_engine

    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig

    engine = seeded_engine(tiny_model_dir, zero_stage=0, lr=0.0)
    traj = _two_turn([11, 12, 13], [21, 22], [31, 32], [41, 42])
    rows, targets = _hand_logprobs(engine.module, traj, 1.0)
    own = torch.zeros(len(traj.token_ids()))
    m = torch.tensor(traj.loss_mask(), dtype=torch.bool)
    own[m] = rows.gather(-1, targets[:, None]).squeeze(-1).detach()
    teacher = [TeacherTokens(own, m.float(), torch.zeros(len(own), dtype=torch.long))]
    for at, expected in (("current", [0.0] * 4), ("behaviour", (-1.0 - own[m]).tolist())):
        updater = PolicyUpdater(engine, UpdateConfig(), LossConfig(), 0,
                                distill=DistillConfig(teacher="smollm2", at=at))
        stats = updater.update([traj], [np.zeros(4)], teacher)  # the sampling logprobs are −1 per token
        assert stats.distill_kl == pytest.approx(expected, abs=1e-5), at


# -- the teacher ----------------------------------------------------------------------------------------
def test_privileged_context_reaches_only_the_teacher(tiny_model_dir):
    """The teacher scores [system turn with the context] + the trajectory's own ids; the trajectory is left as
    sampled; a trajectory the prefix takes past the teacher's window gets no signal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sleuth.tasks.base import Task
    from sleuth.training.distill.teacher import Teacher
    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.zero import init_distributed

    init_distributed()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    task = Task("t0", "Who?", answer="Ada Lovelace", aliases=["Lovelace"])
    traj = _two_turn([11, 12, 13], [21, 22], [31, 32, 33], [41, 42])
    before = traj.token_ids()
    cfg = DistillConfig(teacher="smollm2", teacher_context="answer", teacher_temperature=2.0)
    teacher = Teacher(cfg, ScoredForward(model, model, 2.0), tok, 0, max_length=4096, micro_batch_tokens=4096)
    got = teacher.score([traj], {"t0": task})[0]
    assert traj.token_ids() == before  # the student's trajectory is untouched
    prefix = teacher.context_ids(task)
    assert "Ada Lovelace" in tok.decode(prefix) and "also accepted: Lovelace" in tok.decode(prefix)
    assert not set(tok.encode("Ada Lovelace")) <= set(before)
    ids = torch.tensor([prefix + before])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / 2.0, -1)
    m = np.asarray(traj.loss_mask(), dtype=bool)
    pos = np.nonzero(m)[0] + len(prefix)
    expected = logp[pos - 1, ids[0, pos]]
    assert torch.allclose(got.logprobs[m], expected, atol=1e-5)
    assert got.signal.tolist() == traj.loss_mask() and got.turn.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 2, 2]
    plain = Teacher(DistillConfig(teacher="smollm2"), ScoredForward(model, model, 2.0), tok, 0, 4096, 4096)
    assert not torch.allclose(plain.score([traj], {"t0": task})[0].logprobs[m], expected, atol=1e-3)
    narrow = Teacher(cfg, ScoredForward(model, model, 2.0), tok, 0, len(prefix) + len(before) - 1, 4096)
    assert narrow.score([traj], {"t0": task})[0].signal.sum() == 0


def test_supporting_documents_are_the_gold_ones(hotpot_tasks):
    from sleuth.tasks.qa import qa_docs
    from sleuth.training.distill.teacher import privileged_text

    task = hotpot_tasks[0]
    docs = qa_docs(task)
    text = privileged_text(task, "supporting")
    for d in docs.docs:
        assert (d.text in text) == (d.title in docs.supporting)
    with pytest.raises(ConfigError, match="no payload key 'nope'"):
        privileged_text(task, "payload.nope")


def test_a_teacher_with_another_vocabulary_is_refused_naming_both(tiny_model_dir, tmp_path):
    """A real causal LM on another real tokenizer (the MiniLM encoder's WordPiece) against SmolLM2's."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from sleuth.envs.retrieval.dense import minilm_dir
    from sleuth.training.distill.load import load_teacher
    from sleuth.training.run import PolicyModel

    other = tmp_path / "wordpiece-lm"
    wp = AutoTokenizer.from_pretrained(minilm_dir())
    LlamaForCausalLM(LlamaConfig(vocab_size=len(wp), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2)).save_pretrained(other)
    wp.save_pretrained(other)
    student = PolicyModel(tiny_model_dir, AutoTokenizer.from_pretrained(tiny_model_dir), 0, torch.float32, None, 64)
    with pytest.raises(ConfigError) as e:
        load_teacher(DistillConfig(teacher=str(other)), student, True, 1024, 4096)
    msg = str(e.value)
    assert "\n" not in msg and str(other) in msg and tiny_model_dir in msg and "different vocabularies" in msg
    with pytest.raises(ConfigError, match="cannot be loaded") as e:
        load_teacher(DistillConfig(teacher=str(tmp_path / "missing")), student, True, 1024, 4096)
    assert "\n" not in str(e.value)
    # a teacher kept on the host (`teacher_device: cpu`): its weights and its forwards are there
    teacher = load_teacher(DistillConfig(teacher=tiny_model_dir, teacher_device="cpu"), student, True, 1024, 4096)
    assert teacher.device == torch.device("cpu")
    assert {p.device for p in teacher.forward.model.parameters()} == {torch.device("cpu")}


# -- through the trainer and the CLI ------------------------------------------------------------------------
def test_opd_recipe_trains_and_logs(tiny_model_dir, tmp_path):
    """configs/docread_opd.yaml (pure OPD, the student with the gold documents as its teacher) on the tiny model:
    the row carries the teacher's metrics, and the rollouts the student was trained on never hold the context."""
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config("docread_opd", {"model": tiny_model_dir, "out": str(tmp_path / "run"), "task_limit": 8,
                                      "max_steps": 1, "rollout.max_tokens": 8, "rollout.group_size": 2,
                                      "checkpoint.export_hf": False, "rollout.tasks_per_step": 1})
    trainer = Trainer(cfg, progress=False)
    row = trainer.train()[0]
    assert row["distill/signal_share"] == 1.0 and row["distill/teacher_s"] > 0 and row["no_signal"] == 0
    assert np.isfinite(row["distill/reverse_kl"]) and "distill/reverse_kl/turn_1" in row
    # no estimator advantage: the policy loss at ratio 1 is the mean penalty, λ·mean(log π_s − log π_T)
    assert row["loss/policy"] == pytest.approx(row["distill/reverse_kl"], abs=1e-5)
    rollouts = (tmp_path / "run/rollouts/step-000001.rank0.jsonl").read_text().splitlines()
    for t in map(Trajectory.from_json, rollouts):
        assert "Documents that answer the question" not in trainer.tokenizer.decode(t.token_ids())
        assert "Documents that answer the question" in trainer.tokenizer.decode(
            trainer.teacher.context_ids(trainer.tasks_by_id[t.task_id]))


def test_a_teacher_that_cannot_be_loaded_stops_the_cli_in_one_line(tiny_model_dir, tmp_path):
    out = subprocess.run([sys.executable, "-m", "sleuth.cli", "train", "--config", "docread_opd", "--out",
                          str(tmp_path / "run"), "--set", f"model={tiny_model_dir}", "--set",
                          "algorithm.distill.teacher=/no/such/teacher"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "algorithm.distill.teacher '/no/such/teacher' cannot be loaded" in last
    assert not (tmp_path / "run" / "rollouts").exists()  # refused before any rollout


def _exact_reverse_kl(student, teacher, trajs) -> float:
    """Mean over the policy tokens of `trajs` of KL(π_s ‖ π_T) over the whole vocabulary, at T = 1."""
    total, n = 0.0, 0
    with torch.no_grad():
        for t in trajs:
            ids = torch.tensor([t.token_ids()])
            m = torch.tensor(t.loss_mask(), dtype=torch.bool)[1:]
            s = torch.log_softmax(student(input_ids=ids).logits[0, :-1][m].float(), -1)
            q = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1][m].float(), -1)
            total += float((s.exp() * (s - q)).sum())
            n += int(m.sum())
    return total / n


def _small_lm(path, seed: int):
    """A one-layer causal LM over 128 ids with opinions (head × 10): a sampled estimator over SmolLM2's 49k ids
    on near-uniform random models would need thousands of samples per step to see where two models differ."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    model.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("kind, lr, steps", [("reverse_kl", 0.1, 15), ("topk_forward_kl", 0.01, 10)])
def test_on_policy_distillation_moves_the_student_towards_a_teacher_it_has_never_seen(tmp_path, kind, lr, steps):
    """The student samples, the teacher (another model, never trained with) scores the samples, the update
    reads its signal: the exact KL(π_s ‖ π_T) on held-out samples of the student falls."""
    from train_helpers import seeded_engine
    from transformers import AutoModelForCausalLM

    from sleuth.training.distill.teacher import Teacher
    from sleuth.training.rl.forward import ScoredForward
    from sleuth.training.rl.losses import LossConfig
    from sleuth.training.rl.update import PolicyUpdater, UpdateConfig

    engine = seeded_engine(_small_lm(tmp_path / "student", 0), zero_stage=0, lr=lr)
    teacher_model = AutoModelForCausalLM.from_pretrained(_small_lm(tmp_path / "teacher", 1)).eval()
    cfg = DistillConfig(teacher="local", kind=kind)
    teacher = Teacher(cfg, ScoredForward(teacher_model, teacher_model), None, 0, 4096, 4096)
    updater = PolicyUpdater(engine, UpdateConfig(), LossConfig(), 0, distill=cfg)
    gen = torch.Generator().manual_seed(0)

    def sample(n: int) -> list[Trajectory]:
        """n episodes of 8 sampled tokens after 4 random prompt ids, all n rows in one forward per token."""
        ids, logps = torch.randint(1, 128, (n, 4), generator=gen), []
        with torch.no_grad():
            for _ in range(8):
                lp = torch.log_softmax(engine.module(input_ids=ids).logits[:, -1], -1)
                y = torch.multinomial(lp.exp(), 1, generator=gen)
                ids, logps = torch.cat([ids, y], 1), [*logps, lp.gather(1, y)]
        lps = torch.cat(logps, 1).tolist()
        return [Trajectory(f"t{i}", "env", ids[i, :4].tolist(), turns=[Turn(ids[i, 4:].tolist(), lps[i], "a")],
                           group="g") for i in range(n)]

    held_out = sample(16)
    before = _exact_reverse_kl(engine.module, teacher_model, held_out)
    for _ in range(steps):
        trajs = sample(16)
        updater.update(trajs, [np.zeros(8)] * 16, teacher.score(trajs, {}))
    after = _exact_reverse_kl(engine.module, teacher_model, held_out)
    assert after < 0.8 * before, (before, after)


def test_lora_student_with_a_self_teacher_and_the_topk_loss(tiny_model_dir, tmp_path):
    """LoRA × the top-k forward KL × a `self` teacher: the teacher is the adapted policy (no second model) and
    the loss term reaches the adapters."""
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config("docread_opd", {
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "task_limit": 8, "max_steps": 1,
        "rollout.max_tokens": 8, "rollout.group_size": 2, "rollout.tasks_per_step": 1, "checkpoint.export_hf": False,
        "algorithm.distill.kind": "topk_forward_kl", "algorithm.distill.teacher_context": "answer",
        "deepspeed.lora": {"r": 4}, "deepspeed.lr": 1e-2})
    trainer = Trainer(cfg, progress=False)
    row = trainer.train()[0]
    assert row["loss/distill"] > 0 and row["grad_norm"] > 0 and row["distill/signal_share"] == 1.0
    assert trainer.teacher.forward.model is trainer.engine


def test_zero3_student_with_a_self_teacher(tiny_model_dir, tmp_path):
    """ZeRO-3 partitions the policy's weights: the `self` teacher's forwards gather them like the update's own."""
    from sleuth.training.rl.trainer import Trainer

    cfg = load_config("docread_opd_cigpo", {
        "model": tiny_model_dir, "out": str(tmp_path / "run"), "task_limit": 8, "max_steps": 1,
        "rollout.max_tokens": 8, "rollout.group_size": 2, "rollout.tasks_per_step": 1, "checkpoint.export_hf": False,
        "deepspeed.zero_stage": 3, "algorithm.distill.teacher_context": "answer"})
    row = Trainer(cfg, progress=False).train()[0]
    assert row["distill/signal_share"] == 1.0 and np.isfinite(row["distill/reverse_kl"]) and row["grad_norm"] > 0
