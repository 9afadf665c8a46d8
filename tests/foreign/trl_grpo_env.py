"""TRL's GRPOTrainer, 2 steps on a sleuth env through `environment_factory` (run by tests/test_outbound.py in its
own process: TRL and accelerate keep process-wide state). argv: a tiny model's directory, an output directory.
The tiny model is first taught one reply (a call of `answer` with "yes", in the Qwen2.5 tool-call format whose
parser TRL ships) so that TRL's tool loop has calls to run; each step's logs are printed as `STEP {json}`."""

import json
import sys
import time
from pathlib import Path

import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer

from sleuth.envs.outbound.trl import environment_factory, task_dataset
from sleuth.tasks import load_tasks

model_dir, out = sys.argv[1], Path(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
tokenizer.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
model = AutoModelForCausalLM.from_pretrained(model_dir)
tasks = [t for t in load_tasks("hotpotqa:test", limit=40) if t.answer in ("yes", "no")][:4]
assert {t.answer for t in tasks} == {"yes", "no"}, "the test needs yes and no questions"
DocRead = environment_factory("sleuth/DocRead-v0", tasks)
dataset = task_dataset(DocRead)

env = DocRead()
schemas = [get_json_schema(getattr(env, name)) for name in ("read", "answer")]
reply = tokenizer('<tool_call>\n{"name": "answer", "arguments": {"text": "yes"}}\n</tool_call><|im_end|>',
                  add_special_tokens=False)["input_ids"]
examples = []
for row in dataset:
    messages = [row["prompt"][0], {"role": "user", "content": env.reset(**row)}]
    prompt = tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, return_dict=True)
    examples.append((prompt["input_ids"], reply))
start = time.perf_counter()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
for _ in range(40):
    for prompt, target in examples:
        # only the reply's logits: the vocabulary-wide head over the whole prompt would cost ~20x more
        logits = model(input_ids=torch.tensor([prompt + target]), logits_to_keep=len(target) + 1).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor(target))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


print("SFT", loss.item(), time.perf_counter() - start, flush=True)


class PrintLogs(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "tools/call_frequency" in logs:
            print("STEP " + json.dumps(logs), flush=True)


args = GRPOConfig(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=48, use_cpu=True, report_to=[], logging_steps=1, save_strategy="no",
                  learning_rate=1e-5, seed=0)
trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=dataset,
                      environment_factory=DocRead, callbacks=[PrintLogs()])
trainer.train()
