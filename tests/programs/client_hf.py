"""HF ``Trainer(report_to=["wandb"])`` under torchrun: a tiny BERT built from a config (no
download), trained for a few steps on random tokens, evaluated twice.

Plain HF code. ``CLIENT_INSTALL=1`` adds the one line a user adds: ``install()``.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import torch
from _prelude import end_process_group_at_exit
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

end_process_group_at_exit()


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (n, 12), generator=generator)
        self.labels = torch.randint(0, 2, (n,), generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones_like(self.ids[i]),
            "labels": self.labels[i],
        }


def main() -> None:
    output_dir = sys.argv[1]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        id2label={0: "neg", 1: "pos"},  # int keys, as every HF classification config has
        label2id={"neg": 0, "pos": 1},
    )
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=output_dir,
        run_name="hf-run",
        report_to=["wandb"],
        max_steps=12,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=6,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=RandomTokens(64), eval_dataset=RandomTokens(16)
    )
    trainer.train()


if __name__ == "__main__":
    main()
