"""A verifiers env package written for verifiers < 0.4 (`load_environment()` returning a `vf.SingleTurnEnv`), which
verifiers 0.4 (v1) no longer loads: sleuth must refuse it in one line naming the form."""
import verifiers as vf


def load_environment(**kwargs) -> vf.Environment:
    dataset = [{"question": "What is 2 + 2?", "answer": "4"}]
    rubric = vf.Rubric(funcs=[lambda completion, answer, **_: float(answer in str(completion))])
    return vf.SingleTurnEnv(dataset=dataset, rubric=rubric, **kwargs)
