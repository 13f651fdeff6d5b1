"""A private supervised fine-tuning trainer on TRL's ``SFTTrainer`` (needs ``trl``).

TRL's data handling (text, prompt-completion and conversational data sets, chat templates, completion-only
and assistant-only losses as label masks) with :class:`~dpnoise.huggingface.PrivateTrainer`'s private steps:
each example's loss is the mean over its own predicted tokens (the per-sequence loss,
:func:`~dpnoise.training.causal_lm_loss`, which reads TRL's label masks), packing and padding-free batches
are refused (they join several examples into one row), and TRL's token-level metrics of the private
batches (entropy, token accuracy) are not computed.
"""

from __future__ import annotations

from trl import SFTTrainer

from dpnoise.huggingface.trainer import PrivateTrainingMixin


class PrivateSFTTrainer(PrivateTrainingMixin, SFTTrainer):
    """TRL's ``SFTTrainer`` whose every optimizer step is a private step: ``SFTTrainer``'s arguments (``args``
    an ``SFTConfig``, ``processing_class``, ...) and :class:`~dpnoise.huggingface.PrivateTrainer`'s privacy
    arguments (``privacy``, ``execution``, ``logical_batch_size``, ``loss_fn``, ``seed``, ``noise_seed``,
    ``log_private_batch_stats``, ``privacy_unit``: its keys must follow the rows of the dataset as ``SFTTrainer``
    prepares it, which a length mismatch refuses)."""
