"""A user's own reasoning-gym dataset, written as reasoning-gym's own are (`reasoning_gym/arithmetic/gcd.py`): a
config dataclass with `seed`, `size` and `validate()`, a `ProceduralDataset` subclass whose item `idx` comes from
`Random(self.seed + idx)`, and `register_dataset(name, DatasetCls, ConfigCls)` at import. sleuth reaches it as
`reasoning_gym:rg_user_dataset:digit_sum`."""

from dataclasses import dataclass
from random import Random

from reasoning_gym.factory import ProceduralDataset, register_dataset

DATASET_NAME = "digit_sum"


@dataclass
class DigitSumConfig:
    """Configuration for digit sum problems"""

    min_digits: int = 2
    max_digits: int = 4
    seed: int | None = None
    size: int = 500  # Virtual dataset size

    def validate(self) -> None:
        """Validate configuration parameters"""
        assert 1 <= self.min_digits <= self.max_digits, "need 1 <= min_digits <= max_digits"


class DigitSumDataset(ProceduralDataset):
    """Generates 'sum the digits of N' problems"""

    def __init__(self, config: DigitSumConfig):
        super().__init__(config=config, seed=config.seed, size=config.size)

    def __getitem__(self, idx: int) -> dict:
        rng = Random(self.seed + idx)
        digits = rng.randint(self.config.min_digits, self.config.max_digits)
        number = rng.randint(10 ** (digits - 1), 10**digits - 1)
        return {
            "question": f"What is the sum of the digits of {number}?",
            "answer": str(sum(int(d) for d in str(number))),
            "metadata": {"source_dataset": DATASET_NAME, "source_index": idx, "number": number},
        }


register_dataset(DATASET_NAME, DigitSumDataset, DigitSumConfig)
