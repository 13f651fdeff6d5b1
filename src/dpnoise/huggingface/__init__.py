"""dpnoise in the Hugging Face stack (needs ``transformers``): :class:`PrivateTrainer`, Trainer with every
optimizer step a private, accounted one (docs/HUGGINGFACE.md)."""

from dpnoise.huggingface.trainer import CHECKPOINT_NAME, LogicalBatch, LogicalBatches, PrivateTrainer

__all__ = ["CHECKPOINT_NAME", "LogicalBatch", "LogicalBatches", "PrivateTrainer"]
