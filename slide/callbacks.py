"""Hooks into :meth:`slide.Network.fit`.

A callback is any object with some of the methods of :class:`Callback`; missing methods are
skipped. The training loop calls them in this order::

    on_train_begin(net)
      on_batch_end(net, step, loss)      after every batch; loss is the batch's mean loss
      on_evaluate(net, record)           after every evaluation (record = one History entry)
      on_epoch_end(net, epoch)           epoch = number of completed epochs
    on_train_end(net, history)           also after an interruption or an early stop

Any callback may set ``net.stop_training = True``; the loop then stops after the current batch,
keeping the network consistent (it can be evaluated, saved and resumed).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Dict, Optional, Union

__all__ = ["Callback", "ProgressBar", "Checkpoint", "LogMetrics", "StopAfter"]

log = logging.getLogger("slide")


class Callback:
    """Base class: override what you need. All methods default to doing nothing."""

    def on_train_begin(self, net) -> None:
        pass

    def on_batch_end(self, net, step: int, loss: float) -> None:
        pass

    def on_evaluate(self, net, record: Dict[str, Any]) -> None:
        pass

    def on_epoch_end(self, net, epoch: int) -> None:
        pass

    def on_train_end(self, net, history) -> None:
        pass


class ProgressBar(Callback):
    """Progress over the samples of the run: samples/s, the running loss, P@1, and an ETA where
    the length is known.

    ``fit(..., progress=True)`` adds one, and ``slide train`` shows one. It writes to stderr (or
    ``file``) only because the caller asked for it; the library itself never prints.

    - On a terminal (or in a notebook, ``file=None``) it is a tqdm bar. ``leave=False`` clears it
      when training ends; ``disable=True`` shows nothing.
    - To a ``file`` that is not a terminal (a log file, a pipe, a batch job's output), a bar
      would write a carriage return per update into the file. Instead it writes whole lines:
      one every ``log_every`` seconds, one when a phase ends and one at the end of training,
      each ``PHASE: <tqdm's meter>``.
    - With ``epochs: auto`` the search's length is not known in advance (no total). When it ends,
      the progress starts again for the refit, whose length is known: percentage and ETA.
    """

    def __init__(self, file=None, smoothing: float = 0.05, *, leave: bool = True, disable: bool = False,
                 log_every: float = 60.0):
        self.file = file
        self.smoothing = smoothing
        self.leave = leave
        self.disable = disable
        self.log_every = log_every
        self._bar = None
        self._lines: Optional[_Lines] = None    # line mode (a file that is not a terminal)
        self._phase: Optional[str] = None
        self._loss: Optional[float] = None
        self._last_p1: Optional[float] = None
        self._epoch = 0

    def on_train_begin(self, net) -> None:
        self._phase = getattr(net, "_phase", None)
        # samples still to train in this phase of this fit call (a resumed run starts part way)
        total = getattr(net, "_progress_total_samples", None) or None
        self._loss = None
        if not self.disable and self.file is not None and not _is_terminal(self.file):
            self._lines = _Lines(total)
            return
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, unit="samples", unit_scale=True, file=self.file,
                         smoothing=self.smoothing, dynamic_ncols=True, leave=self.leave,
                         disable=self.disable, desc=self._desc())

    def _desc(self) -> Optional[str]:
        return self._phase if self._phase in ("search", "refit") else None

    def _postfix(self) -> Dict[str, str]:
        post = {"epoch": str(self._epoch), "loss": f"{self._loss:.4f}"} if self._loss is not None else {}
        if self._last_p1 is not None:
            post["P@1"] = f"{self._last_p1:.4f}"
        return post

    def _write_line(self) -> None:
        from tqdm import tqdm

        lines = self._lines
        now = time.perf_counter()
        meter = tqdm.format_meter(lines.samples, lines.total, now - lines.start, ncols=0, unit=" samples",
                                  unit_scale=True,
                                  postfix=", ".join(f"{k}={v}" for k, v in self._postfix().items()) or None)
        print(f"{self._desc() or 'train'}: {meter.strip()}", file=self.file, flush=True)
        lines.written = now

    def _new_phase(self, net) -> None:
        """The search ended and the refit starts: the counter starts again, with the refit's total."""
        total = getattr(net, "_progress_total_samples", None) or None
        if self._lines is not None:
            if not self._lines.at_total:
                self._write_line()                   # where the phase that ended stood
            self._phase = getattr(net, "_phase", None)
            self._lines = _Lines(total)
        else:
            self._phase = getattr(net, "_phase", None)
            self._bar.reset(total=total)
            self._bar.set_description(self._desc(), refresh=False)

    def on_batch_end(self, net, step: int, loss: float) -> None:
        if self._bar is None and self._lines is None:
            return
        if getattr(net, "_phase", None) != self._phase:
            self._new_phase(net)
        self._loss = loss if self._loss is None else 0.98 * self._loss + 0.02 * loss
        self._epoch = net.epoch + 1      # the epoch this batch belongs to
        samples = int(getattr(net, "_last_batch_size", 0)) or net.config.training.batch_size
        lines = self._lines
        if lines is not None:
            lines.samples += samples
            done = lines.total is not None and lines.samples >= lines.total
            if not lines.at_total and (done or time.perf_counter() - lines.written >= self.log_every):
                self._write_line()   # at the total at once: an ensemble trains more networks after it
                lines.at_total = done
            return
        self._bar.update(samples)
        if step % 10 == 0:
            self._bar.set_postfix(self._postfix(), refresh=False)

    def on_evaluate(self, net, record: Dict[str, Any]) -> None:
        if "P@1" in record:
            self._last_p1 = record["P@1"]

    def on_train_end(self, net, history) -> None:
        if self._lines is not None:
            if not self._lines.at_total:
                self._write_line()
            self._lines = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def write(self, line: str, file=None) -> None:
        """Print ``line`` (to stdout, or ``file``) above the bar without breaking it."""
        if self._bar is not None:
            self._bar.write(line, file=file or sys.stdout)
        else:
            print(line, file=file or sys.stdout, flush=True)


class _Lines:
    """ProgressBar's line mode, for one phase: samples so far of ``total`` (None: not known),
    when the phase started and the last line was written, and whether the line at the total
    was written."""

    def __init__(self, total: Optional[int]):
        self.samples, self.total = 0, total
        self.start = self.written = time.perf_counter()
        self.at_total = False


def _is_terminal(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):   # no isatty, or a closed file
        return False


# Checkpoints every "auto" epochs (training.checkpoint_every, Checkpoint): the most of a run's
# wall time that epoch-end checkpoints may take. A checkpoint holds the weights and the
# optimizer's moments (three times the model): on a 47K-feature input layer one write takes
# about as long as five epochs of training (benchmarks/checkpoints.py).
CHECKPOINT_SHARE = 0.05


def epoch_checkpoint_due(every: Union[int, str], epoch: int, since_last: float,
                         write_seconds: Optional[float]) -> bool:
    """Whether the end of epoch ``epoch`` writes a checkpoint under ``every`` (N epochs, 0 = none,
    or ``"auto"``: the first end of an epoch, then once ``1 / CHECKPOINT_SHARE`` times the last
    write's ``write_seconds`` have passed; ``since_last``: seconds since that write ended)."""
    if every == "auto":
        return write_seconds is None or since_last >= write_seconds / CHECKPOINT_SHARE
    return every > 0 and epoch % every == 0


class Checkpoint(Callback):
    """Save the network (with its full resume state) during training.

    Writes ``path`` atomically every ``every_epochs`` completed epochs (0 = only at the end;
    ``"auto"``, as ``training.checkpoint_every: auto`` in ``slide train``: at the end of the first
    epoch, then at the end of an epoch once 20 times the last save's duration has passed) and,
    when ``minutes`` > 0, after any batch once that much wall time passed since the last save.
    A checkpoint written mid-epoch resumes at the next batch: ``Network.load(path).fit(train)``
    continues exactly where the run stopped.
    """

    def __init__(self, path: Union[str, os.PathLike], every_epochs: Union[int, str] = 1, minutes: float = 0.0):
        if every_epochs != "auto" and (isinstance(every_epochs, str) or every_epochs < 0):
            raise ValueError(f"Checkpoint: every_epochs must be >= 0 or 'auto', got {every_epochs!r}")
        if minutes < 0:
            raise ValueError(f"Checkpoint: minutes must be >= 0, got {minutes}")
        self.path = os.fspath(path)
        self.every_epochs = every_epochs if every_epochs == "auto" else int(every_epochs)
        self.minutes = float(minutes)
        self._last = time.monotonic()
        self._write_seconds: Optional[float] = None
        self.saved = 0

    def _save(self, net) -> None:
        started = time.monotonic()
        net.save(self.path)
        self.saved += 1
        self._last = time.monotonic()
        self._write_seconds = self._last - started
        log.info("checkpoint written: %s (epoch %d, step %d)", self.path, net.epoch, net.step)

    def on_train_begin(self, net) -> None:
        self._last = time.monotonic()

    def on_batch_end(self, net, step: int, loss: float) -> None:
        if self.minutes > 0 and time.monotonic() - self._last >= 60.0 * self.minutes:
            self._save(net)

    def on_epoch_end(self, net, epoch: int) -> None:
        if epoch_checkpoint_due(self.every_epochs, epoch, time.monotonic() - self._last, self._write_seconds):
            self._save(net)

    def on_train_end(self, net, history) -> None:
        self._save(net)


class LogMetrics(Callback):
    """Send each evaluation record to the ``slide`` logger (INFO)."""

    def __init__(self, logger: Optional[logging.Logger] = None):
        self.logger = logger or log

    def on_evaluate(self, net, record: Dict[str, Any]) -> None:
        parts = [f"epoch {record['epoch']}", f"step {record['step']}", f"loss {record['loss']:.4f}",
                 f"{record['samples_per_second']:.0f} samples/s"]
        parts += [f"{k} {v:.4f}" for k, v in record.items() if "/" in k and k.endswith("P@1")]
        self.logger.info(", ".join(parts))


class StopAfter(Callback):
    """Stop training after ``steps`` batches of this fit call (useful for quick trials)."""

    def __init__(self, steps: int):
        if steps < 1:
            raise ValueError(f"StopAfter: steps must be >= 1, got {steps}")
        self.steps = int(steps)
        self._seen = 0

    def on_train_begin(self, net) -> None:
        self._seen = 0

    def on_batch_end(self, net, step: int, loss: float) -> None:
        self._seen += 1
        if self._seen >= self.steps:
            net.stop_training = True
