"""Run under torchrun (gloo) with 2 processes: an FSDP run saves at step 2, trains 2 more steps, and
process 0 is killed (SIGKILL, as by the OOM killer) in its next save, after every shard of step 4
is written but before ``checkpoint.pt`` names them. argv: the run directory."""

from __future__ import annotations

import os
import signal
import sys

import tokenmix.train.checkpointing
from tokenmix.train.config import TrainConfig
from tokenmix.train.loop import Trainer

small = {"options": {"rpe_dim": 8}, "eval_tokens": 1024, "final_eval_tokens": 1024}  # the resume's final evaluation too
config = TrainConfig(dim=16, depth=2, seq_len=64, batch_size=2, steps=8, threads=1, fsdp=True, save_every="1000", out=sys.argv[1], **small)
trainer = Trainer(config, progress=False)
for _ in range(2):
    trainer.train_step()
trainer.save()
for _ in range(2):
    trainer.train_step()
if trainer.dims.is_main:
    tokenmix.train.checkpointing.save_checkpoint = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
trainer.save()
