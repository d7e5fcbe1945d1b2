"""Run under torchrun: several ``tokenmix`` commands one after the other in each process, each as it runs
under a torchrun launch of its own (one launch for many: every launch costs each process its start-up).
argv: a JSON file of [{"argv": [...], "log": path}]; each command's stdout and stderr go to ``<log>.rank<R>``.
The launch stops with the first command that fails, or that succeeds where it has "refused": true (a command
that must stop with an error, after which the launch goes on: the next command runs in the same processes)."""

from __future__ import annotations

import contextlib
import json
import os
import sys

from tokenmix.cli import main

rank, attempt = os.environ["RANK"], os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
with open(sys.argv[1]) as file:
    commands = json.load(file)
for index, command in enumerate(commands):
    # each command's process group under keys of its own in torchrun's store (tokenmix.parallel.distributed.attempt_store):
    # the addresses the previous command's group published there are not read as this one's
    os.environ["TORCHELASTIC_RESTART_COUNT"] = f"{attempt}.{index}"
    with open(f"{command['log']}.rank{rank}", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        try:
            status = main(command["argv"])
        except SystemExit as exit:  # a refusal by the argument parser
            status = exit.code
    if command.get("refused"):
        if not status:
            sys.exit(f"{command['argv']} ran, where it should have been refused")
    elif status:
        sys.exit(status)
