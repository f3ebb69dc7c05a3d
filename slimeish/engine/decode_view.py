"""The decode view: each decoding sequence's KV as one contiguous row, kept from step to step.

The pool (`model_runner.PagedKV`) holds KV in pages, while a decode step's attention reads every
sequence's keys and values as one block. Gathering each sequence's pages into a fresh block in
every layer of every step was ~20 % of a c=64 decode step of the tiny model. The view keeps the
gathered rows, per layer `[rows, heads, capacity, dim]`, across steps: a step writes its new
token's K/V into the pool (which stays the record: the prefix cache, prefill chunks and routes read
it) and into the sequence's row, and gathers only the rows of sequences new to the batch (just
prefilled). A sequence that leaves the batch frees its row; rows past the batch move into the
holes, so a batch of `n` is rows `0 .. n-1`, which attention reads in place.

Rows are padded to the longest sequence (the mask hides the rest; every slot holds a finite value,
so a hidden one adds exactly 0), so the view is bounded by `max_bytes`; a step that would need
more is left to the pool's per-step gather, and the view is dropped until the batch fits again.
"""

from __future__ import annotations

import torch


class DecodeView:
    """Per-layer K/V rows of the sequences decoding together, keyed by a stable id per sequence."""

    def __init__(self, n_layers: int, key_shape: tuple[int, int], value_shape: tuple[int, int], dtype, device,
                 page_size: int, max_bytes: int):  # fmt: skip
        self.n_layers, self.shapes, self.dtype, self.device = n_layers, (key_shape, value_shape), dtype, device
        self.page_size, self.max_bytes = page_size, max_bytes
        itemsize = torch.empty(0, dtype=dtype).element_size()
        self.bytes_per_slot = n_layers * sum(h * d for h, d in self.shapes) * itemsize
        self.write: dict[int, torch.Tensor] = {}  # heads -> flat `[rows * heads * capacity]` slot of each new K/V
        self._drop()

    def _drop(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.members: list[int] = []  # the id of the sequence in each row; row i of the batch is row i here
        self.lengths: dict[int, int] = {}  # id -> positions of its row that hold its KV
        self.capacity = 0

    def arrange(
        self, ids: list[int], positions: list[int], pages: list[list[int]], pool_keys: list[torch.Tensor],
        pool_values: list[torch.Tensor],
    ) -> list[int] | None:  # fmt: skip
        """Make rows `0 .. n-1` hold the sequences `ids`, each with its KV of positions below
        `positions[i]` (where this step writes its token); returns each sequence's row, or None when
        the batch does not fit in `max_bytes` (the caller gathers from the pool instead)."""
        n, need, capacity = len(ids), max(positions) + 1, self.capacity
        if not self._fit(n, need):
            self._drop()
            return None
        current = {key: pos for key, pos in zip(ids, positions, strict=True)}
        if self.capacity == capacity and current == self.lengths:
            # the same batch as the last step, one token further: every row stays, and each new
            # token's slot is the one after the last step's (most steps; no index built anew)
            self.lengths = {key: pos + 1 for key, pos in current.items()}
            self.write = {h: slots + 1 for h, slots in self.write.items()}
            row_of = {key: row for row, key in enumerate(self.members)}
            return [row_of[key] for key in ids]
        # a row is kept when its sequence is still in the batch at the length the view holds
        kept = {key for key in self.members if current.get(key) == self.lengths.get(key)}
        row_of = {key: row for row, key in enumerate(self.members) if key in kept}
        holes = [row for row in range(n) if row >= len(self.members) or self.members[row] not in kept]
        movers = [key for key, row in row_of.items() if row >= n]
        moves = list(zip((row_of[key] for key in movers), holes, strict=False))
        for key, (_, dst) in zip(movers, moves, strict=True):
            row_of[key] = dst
        fresh = [i for i, key in enumerate(ids) if key not in kept]
        for i, dst in zip(fresh, holes[len(movers) :], strict=True):
            row_of[ids[i]] = dst
        self.members = [0] * n
        at_row = [0] * n
        for i, key in enumerate(ids):
            self.members[row_of[key]], at_row[row_of[key]] = key, positions[i]
        self.lengths = {key: pos + 1 for key, pos in current.items()}  # after this step's write
        if moves:
            src_rows, dst_rows = (
                torch.tensor(x, dtype=torch.long, device=self.device) for x in zip(*moves, strict=True)
            )
            for buf in (*self.keys, *self.values):
                buf.index_copy_(0, dst_rows, buf.index_select(0, src_rows))
        if fresh:
            self._gather([row_of[ids[i]] for i in fresh], [pages[i] for i in fresh],
                         [positions[i] for i in fresh], pool_keys, pool_values)  # fmt: skip
        rows = torch.arange(n, device=self.device)[:, None]
        pos = torch.tensor(at_row, dtype=torch.long, device=self.device)[:, None]
        self.write = {h: ((rows * h + torch.arange(h, device=self.device)) * self.capacity + pos).flatten()
                      for h in {h for h, _ in self.shapes}}  # fmt: skip
        return [row_of[key] for key in ids]

    def step(self, view: torch.Tensor, new: torch.Tensor, kv_len: int) -> torch.Tensor:
        """Write the batch's new K/V (`[n, heads, 1, dim]`, row order) into `view` and return the
        batch's rows up to `kv_len`, `[n, heads, kv_len, dim]` (a view: rows are read in place)."""
        n, heads, _, dim = new.shape
        view.view(-1, dim).index_copy_(0, self.write[heads], new.reshape(n * heads, dim))
        return view[:n, :, :kv_len]

    def _fit(self, n: int, need: int) -> bool:
        """Room for `n` rows of `need` positions, growing the buffers (rows and capacity each at
        least doubling, within `max_bytes`) when they are short."""
        rows = self.keys[0].shape[0] if self.keys else 0
        if rows >= n and self.capacity >= need:
            return True
        round_up = lambda x: -(-x // self.page_size) * self.page_size  # noqa: E731
        for new_rows, cap in ((max(n, 2 * rows), round_up(max(need, 2 * self.capacity))), (n, round_up(need))):
            if new_rows * cap * self.bytes_per_slot <= self.max_bytes:
                self._grow(new_rows, cap)
                return True
        return False

    def _grow(self, rows: int, capacity: int) -> None:
        if self.keys and (rows < self.keys[0].shape[0] or capacity < self.capacity):
            self._drop()  # the exact fit is smaller in one dimension: start over, every row gathered anew

        # zeros: a slot no sequence wrote is read (masked) as 0 x value, which must not be NaN
        def grown(old: torch.Tensor | None, heads: int, dim: int) -> torch.Tensor:
            buf = torch.zeros(rows, heads, capacity, dim, dtype=self.dtype, device=self.device)
            if old is not None:
                buf[: old.shape[0], :, : old.shape[2]] = old
            return buf

        (kh, kd), (vh, vd) = self.shapes
        none: list[torch.Tensor | None] = [None] * self.n_layers
        old_k: list[torch.Tensor | None] = list(self.keys) or none
        old_v: list[torch.Tensor | None] = list(self.values) or none
        self.keys = [grown(k, kh, kd) for k in old_k]
        self.values = [grown(v, vh, vd) for v in old_v]
        self.capacity = capacity

    def _gather(self, rows: list[int], pages: list[list[int]], lengths: list[int], pool_keys, pool_values) -> None:
        """Copy the KV of positions below `lengths[i]` of each new sequence from its pages into its row."""
        n_pages = max(-(-length // self.page_size) for length in lengths)
        if n_pages == 0:
            return
        # pad short page tables with their own first page: the copied tail lies past the length, masked
        table = torch.tensor([p[:n_pages] + [p[0]] * (n_pages - len(p[:n_pages])) for p in pages], device=self.device)
        dst = torch.tensor(rows, dtype=torch.long, device=self.device)
        width = n_pages * self.page_size
        for pool, view in zip((*pool_keys, *pool_values), (*self.keys, *self.values), strict=True):
            heads, _, dim = pool.shape
            got = pool.view(heads, -1, self.page_size, dim).index_select(1, table.flatten())
            view[:, :, :width].index_copy_(0, dst, got.view(heads, len(rows), width, dim).transpose(0, 1))
