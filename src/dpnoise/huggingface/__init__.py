"""dpnoise in the Hugging Face stack (needs ``transformers``): :class:`PrivateTrainer`, Trainer with every
optimizer step a private, accounted one, and :class:`PrivateSFTTrainer`, TRL's SFTTrainer likewise (needs
``trl``; imported on first use) (docs/HUGGINGFACE.md)."""

from typing import Any

from dpnoise.huggingface.trainer import (
    CHECKPOINT_NAME,
    LogicalBatch,
    LogicalBatches,
    PrivateTrainer,
    PrivateTrainingMixin,
)

__all__ = ["CHECKPOINT_NAME", "LogicalBatch", "LogicalBatches", "PrivateSFTTrainer", "PrivateTrainer",
           "PrivateTrainingMixin"]


def __getattr__(name: str) -> Any:
    if name == "PrivateSFTTrainer":  # trl is optional
        from dpnoise.huggingface.sft import PrivateSFTTrainer

        return PrivateSFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
