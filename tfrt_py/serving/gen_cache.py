"""The caches of a served decoder's batched generations, kept batch-wide from one tick to
the next (``gen_batching``).

One buffer per cache tensor holds every row of the batch: rows at the front of the batch
axis, positions right-aligned at ``length`` (a row with fewer cached tokens than that is
padded on the left: zeros, masked out). A tick feeds ``buf[:rows, .., :length]`` as each
past; when the model grows its caches by ``Concat(past, new)`` (``Decoder.in_place``) it
also hands ``buf[:rows, .., :length + 1]`` as each present's output buffer, so the model
writes only the new column (an executor that does not write in place copies the present
into it: the same answer). Otherwise the presents are copied into the buffers after the
tick. Either way no tick assembles a padded batch from the rows' own caches.

Copies happen only when the batch changes: a row that joins brings its prompt's cache
(once); a row that leaves is replaced by the last row; a row longer than ``length`` moves
the others right; once every row carries at least ``SLACK`` positions of padding, all
move left (so ``length`` stays within ``SLACK`` of the longest row); and the buffers grow
by doubling (up to what the model's positions can need). An empty batch drops its
buffers. Padding always holds zeros, never NaN, so masked scores stay finite.

Owned by one GenerationBatcher on its event loop's thread. The model reads and writes the
buffers only inside a tick's ``run_async``, which the batcher awaits before it changes the
batch; after a failed tick the batcher drops the whole BatchCache (a call that outlives
its deadline on a worker may still write into these buffers).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..generation import Decoder

__all__ = ["FIRST_LENGTH", "SLACK", "BatchCache"]

#: The padding every row may carry before the batch moves left (positions).
SLACK = 64
#: The positions the buffers hold at first (they double as the batch grows).
FIRST_LENGTH = 64


class BatchCache:
    """The batch-wide caches of ``rows`` (any objects; the batcher's streams), in row order.
    ``join``/``leave`` change the batch between ticks; ``feeds`` gives a tick's inputs
    and output buffers, ``advanced`` records the tick's new column."""

    def __init__(self, dec: Decoder) -> None:
        self.dec = dec
        self.rows: list[Any] = []
        self.length = 0  # cached positions (the padded width of the batch)
        self._own: list[int] = []  # each row's own cached positions
        self._bufs: list[np.ndarray] = []
        self._mask = np.zeros((0, 1), dec.mask_dtype)

    def join(self, row: Any, feeds: dict[str, Any]) -> None:
        """Add ``row``, whose generation's next one-token step has ``feeds`` (its own
        caches as the pasts, batch 1): its caches are copied in, left-padded."""
        dec = self.dec
        first = dec.cache[0]
        n = int(feeds[first.past].shape[first.axis])
        if n > self.length:
            self._move(n - self.length)
        self._fit(len(self.rows) + 1, self.length + 1)
        r, pad = len(self.rows), self.length - n
        for c, buf in zip(dec.cache, self._bufs):
            buf[_row(r, c.axis, 0, pad)] = 0
            buf[_row(r, c.axis, pad, self.length)] = feeds[c.past][0]
        assert dec.attention_mask is not None
        self._mask[r, :pad] = 0
        self._mask[r, pad : self.length] = feeds[dec.attention_mask][0, :n]
        self.rows.append(row)
        self._own.append(n)

    def leave(self, row: Any) -> None:
        """Take ``row`` out (the last row takes its place)."""
        r = self.rows.index(row)
        last = len(self.rows) - 1
        if r != last:
            for c, buf in zip(self.dec.cache, self._bufs):
                buf[_row(r, c.axis, 0, self.length)] = buf[_row(last, c.axis, 0, self.length)]
            self._mask[r, : self.length] = self._mask[last, : self.length]
            self.rows[r], self._own[r] = self.rows[last], self._own[last]
        self.rows.pop()
        self._own.pop()
        if not self.rows:  # an idle batch holds no memory
            self.length = 0
            self._bufs, self._mask = [], np.zeros((0, 1), self.dec.mask_dtype)

    def feeds(self, steps: list[Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """A tick's feeds for the rows, whose ``steps`` (``generation.Steps``, in row order)
        hold each row's next token and position; and the presents' output buffers (None:
        copy them in with ``advanced``)."""
        dec, b, n = self.dec, len(self.rows), self.length
        assert dec.attention_mask is not None and dec.position_ids is not None
        self._fit(b, n + 1)
        self._mask[:b, n] = 1
        feeds: dict[str, Any] = {
            dec.input_ids: np.concatenate([s.feeds[dec.input_ids] for s in steps]),
            dec.position_ids: np.concatenate([s.feeds[dec.position_ids] for s in steps]),
            dec.attention_mask: np.ascontiguousarray(self._mask[:b, : n + 1]),
        }
        outputs: dict[str, Any] | None = {} if dec.in_place else None
        for c, buf in zip(dec.cache, self._bufs):
            feeds[c.past] = buf[_rows(b, c.axis, 0, n)]
            if outputs is not None:
                outputs[c.present] = buf[_rows(b, c.axis, 0, n + 1)]
        return feeds, outputs

    def advanced(self, out: dict[str, Any]) -> None:
        """The tick that returned ``out`` ran: its new column is cached (copied in from
        ``out`` unless it was written in place)."""
        b, n = len(self.rows), self.length
        if not self.dec.in_place:
            for c, buf in zip(self.dec.cache, self._bufs):
                buf[_rows(b, c.axis, 0, n + 1)] = out[c.present]
        self.length = n + 1
        self._own = [k + 1 for k in self._own]
        spare = self.length - max(self._own)
        if spare >= SLACK:
            self._move(-spare)

    def _move(self, by: int) -> None:
        """Every row's cache ``by`` positions right (> 0: the batch widens, zeros come in
        on the left) or left (< 0: ``-by`` positions of common padding dropped)."""
        b, n = len(self.rows), self.length
        self._fit(b, n + by + 1)
        if b:
            lo = max(0, -by)
            for c, buf in zip(self.dec.cache, self._bufs):
                to, of = _rows(b, c.axis, lo + by, n + by), _rows(b, c.axis, lo, n)
                buf[to] = buf[of]
                if by > 0:
                    buf[_rows(b, c.axis, 0, by)] = 0
            self._mask[:b, lo + by : n + by] = self._mask[:b, lo:n].copy()
            if by > 0:
                self._mask[:b, :by] = 0
        self.length = n + by

    def _fit(self, rows: int, length: int) -> None:
        """Buffers holding at least ``rows`` rows of ``length`` positions (doubled when they
        grow, never past what the model's positions and ``SLACK`` can need; what they held
        is kept)."""
        have_rows = self._mask.shape[0]
        have_len = self._mask.shape[1] - 1
        if rows <= have_rows and length <= have_len:
            return
        rows = max(rows, 2 * have_rows, 4) if rows > have_rows else have_rows
        if length > have_len:
            most = (self.dec.max_positions or 1 << 62) + SLACK + 1
            length = max(length, min(max(2 * have_len, FIRST_LENGTH), most))
        else:
            length = have_len
        b, n = len(self.rows), self.length
        bufs = [np.zeros(c.buffer(rows, length).shape, c.dtype) for c in self.dec.cache]
        for c, buf, old in zip(self.dec.cache, bufs, self._bufs):
            buf[_rows(b, c.axis, 0, n)] = old[_rows(b, c.axis, 0, n)]
        mask = np.zeros((rows, length + 1), self.dec.mask_dtype)
        mask[:b, :n] = self._mask[:b, :n]
        self._bufs, self._mask = bufs, mask


def _row(r: int, axis: int, start: int, stop: int) -> tuple[Any, ...]:
    """The index of row ``r``'s positions ``start:stop`` (sequence ``axis``)."""
    return (r, *_span(axis - 1, start, stop))


def _rows(b: int, axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index of the first ``b`` rows' positions ``start:stop`` (sequence ``axis``)."""
    return (slice(0, b), *_span(axis - 1, start, stop))


def _span(before: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index, after the batch axis, of positions ``start:stop`` on a sequence axis with
    ``before`` axes between it and the batch axis."""
    return (*(slice(None),) * before, slice(start, stop))
