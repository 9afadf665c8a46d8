"""Tasks: the data an environment is reset with, and loaders for real data sets."""

from sleuth.tasks.base import Task, TaskError, dataset_to_tasks, read_tasks, tasks_to_dataset, write_tasks
from sleuth.tasks.code import humaneval_task, load_humaneval, load_mbpp, mbpp_task
from sleuth.tasks.holdout import LeakageError, check_tasks, check_texts, held_out_specs, load_held_out
from sleuth.tasks.qa import (
    Document,
    NoDocuments,
    QADocs,
    hotpotqa_task,
    load_hotpotqa,
    load_musique,
    musique_task,
    qa_docs,
)
from sleuth.tasks.registry import DuplicateTaskIdError, data_dir, load_tasks, register_tasks, task_sources

__all__ = [
    "Task", "TaskError", "read_tasks", "write_tasks", "tasks_to_dataset", "dataset_to_tasks",
    "mbpp_task", "humaneval_task", "load_mbpp", "load_humaneval",
    "hotpotqa_task", "musique_task", "load_hotpotqa", "load_musique", "Document", "QADocs", "qa_docs", "NoDocuments",
    "load_tasks", "DuplicateTaskIdError", "register_tasks", "task_sources", "data_dir",
    "LeakageError", "check_tasks", "check_texts", "held_out_specs", "load_held_out",
]
