# Copyright 2026 The domino-hf authors. Licensed under the Apache License, Version 2.0.
"""Where each row's output ends in the batched verify loop (`batch_domino.py`), exactly where plain batched decoding
ends it.

Remote-code file (torch + transformers only). EOS, the length limit and stop strings are checked per row, right after
each of its tokens (`RowEnds.append`). Every other stopping criterion (lm-eval's stop sequences, a user's) is asked as
plain decoding asks it: with the whole batch as plain decoding holds it (rows that ended show pad tokens), one token
column at a time, once every live row has that column (`replay`), so a criterion that answers one bool for the batch
or keeps per-row state sees the same calls in the same order. Plain decoding writes pad tokens after a row's end only
when it has an EOS criterion; without one, a stopped row keeps generating until the whole batch stops (`_flag`).
"""

from __future__ import annotations

import torch


class RowEnds:
    """Each row's tokens and where its output ends, owned for one `decode` call of `DominoBatchDecoder`.

    Args:
        sequences (`torch.LongTensor`): (B, capacity) the prompts in their first `width` columns; the tokens go
            after them (`append` writes them).
        width (`int`): the prompts' padded length.
        budget (`int`): the most tokens a row generates (`max_length - width`).
        eos_ids (`set[int]`): the EOS ids; an output ends at one.
        row_criteria (`list`): criteria asked about one row's own tokens (stop strings).
        batch_criteria (`list`): criteria asked about the whole batch, one token column at a time.
        pad_id (`int`): the pad token plain decoding writes after a row's end.
        pad_finished (`bool`): whether plain decoding writes pads after a row's end (it has an EOS criterion).
        streamer (*optional*): gets each token column once every row has it.

    `generated[row]` counts the tokens a row holds, `final[row]` its output's length once it ended (else None).
    """

    def __init__(self, sequences, width: int, budget: int, eos_ids, row_criteria, batch_criteria, pad_id: int,
                 pad_finished: bool, streamer=None):
        batch = len(sequences)
        self.sequences, self.width = sequences, width
        self.eos_ids, self.row_criteria, self.batch_criteria = eos_ids, row_criteria, batch_criteria
        self.pad_id, self.pad_finished, self.streamer = pad_id, pad_finished, streamer
        self.generated = [0] * batch  # tokens generated per row
        self.final: list[int | None] = [None] * batch  # a row's generated length once it stopped
        self.flagged: list = [False] * batch  # the token column a criterion stopped each row at
        self.stop_at = budget  # every row's output ends by then
        self.replayed = 0  # token columns the whole-batch criteria have been asked about

    def append(self, rows: list[int], new: list[list[int]]) -> None:
        """Give each row of `rows` its tokens `new[i]`, cut where its output ends (EOS, the length limit, a stop
        string)."""
        for row, tokens in zip(rows, new):
            if self.final[row] is not None:  # the stop string of a row before it in this step ended the batch
                continue
            end = self.generated[row]
            for k, token in enumerate(tokens):
                self.sequences[row, self.width + end + k] = token
                if self._row_ends(row, end + k + 1, token):
                    self.final[row] = end + k + 1
                    tokens = tokens[: k + 1]
                    break
            self.generated[row] = end + len(tokens)

    def stop(self, rows: list[int]) -> None:
        """The rows' outputs end where they are now (the time limit)."""
        for row in rows:
            self.final[row] = self.generated[row]

    def _row_ends(self, row: int, length: int, token: int) -> bool:
        """Whether row `row`'s output ends with its token number `length`: at the length limit, at EOS, or at a
        stop string (where plain decoding writes no pads, a stopped row goes on until the whole batch stops)."""
        if length >= self.stop_at or token in self.eos_ids:
            return True
        if self.row_criteria and not self.flagged[row]:
            sequence = self.sequences[row : row + 1, : self.width + length]
            if any(bool(torch.as_tensor(c(sequence, None)).any()) for c in self.row_criteria):
                self._flag(row, length)
                return self.pad_finished or length >= self.stop_at  # this row's flag may have ended the batch
        return False

    def _flag(self, row: int, column: int) -> None:
        """A criterion stopped `row` at token column `column`. With pads its output ends there; without, the batch
        ends at the last row's stop, which every row then reaches."""
        self.flagged[row] = column
        if self.pad_finished:
            if self.final[row] is None or self.final[row] > column:
                self.final[row] = column
                self.generated[row] = min(self.generated[row], column)
        elif all(flag is not False or end is not None for flag, end in zip(self.flagged, self.final)):
            # the batch ends where its last row ended: at a flag, or at the length limit without one
            ends = [end if flag is False else flag for flag, end in zip(self.flagged, self.final)]
            self.stop_at = min(self.stop_at, max(ends))
            for r in range(len(self.final)):
                if self.generated[r] >= self.stop_at:
                    self.final[r] = self.stop_at

    def length(self, row: int) -> int:
        """Row `row`'s output length: where it ended, else the tokens it holds."""
        return self.final[row] if self.final[row] is not None else self.generated[row]

    def longest(self) -> int:
        return max(self.length(r) for r in range(len(self.final)))

    def replay(self, live: list[int], final: bool = False):
        """Ask the whole-batch criteria about each token column once every live row (`live`) has it, with the batch
        as plain decoding would hold it (rows that ended show pad tokens), and stream that column."""
        lengths = [self.generated[r] for r in live]
        ready = self.longest() if final or not lengths else min(lengths)
        while self.replayed < ready:
            self.replayed += 1
            view = self.batch_view(self.width + self.replayed)
            if self.streamer is not None:
                self.streamer.put(view[:, -1].cpu())
            if not self.batch_criteria:
                continue
            done = torch.zeros(len(view), dtype=torch.bool, device=view.device)
            for criterion in self.batch_criteria:
                done |= torch.as_tensor(criterion(view, None), device=view.device).expand(len(view))
            for row in done.nonzero()[:, 0].tolist():
                if self.flagged[row] is False:
                    self._flag(row, self.replayed)
            ready = min(ready, self.longest())

    def batch_view(self, width: int) -> torch.Tensor:
        """The (B, width) sequences as plain decoding holds them: pad tokens after a row's end, where it writes
        them."""
        view = self.sequences[:, :width].clone()
        if self.pad_finished:
            for row, end in enumerate(self.final):
                if end is not None:
                    view[row, self.width + end :] = self.pad_id
        return view
