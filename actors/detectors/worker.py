"""The batch worker: what the pipelines' actor pools run, and what a Serve deployment wraps."""

from __future__ import annotations

import logging
import time
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from redline.actors.detectors.config import DetectorConfig
from redline.actors.detectors.registry import build_detector
from redline.errors import RedlineError

log = logging.getLogger(__name__)

# What a detection worker adds to each row it scores.
DETECTION_FIELDS = [
    pa.field("detector", pa.string()),
    pa.field("toxic_score", pa.float64()),
    pa.field("pred_toxic", pa.bool_()),
    pa.field("probs", pa.list_(pa.float32())),
    pa.field("seconds", pa.float64()),  # this row's share of its batch's model time
]

# What a detection worker returns per batch (joined back onto the corpus rows by `id`).
DETECTION_BATCH_SCHEMA = pa.schema(
    [pa.field("id", pa.string()), pa.field("shard", pa.int32())]
    + DETECTION_FIELDS
    + [pa.field("det_status", pa.string()), pa.field("det_reason", pa.string())]
)


class DetectionWorker:
    """Loads one detector once, then scores batches; a batch that fails is retried row by row so
    one bad row is reported as an error on that row instead of sinking its neighbours."""

    input_columns: ClassVar[list[str]] = ["id", "text"]
    output_schema: ClassVar[pa.Schema] = DETECTION_BATCH_SCHEMA

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.detector = build_detector(config)

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        texts = [str(t) for t in batch["text"]]
        started = time.perf_counter()
        probs, score, toxic, status, reason = self.score(texts)
        per_row = (time.perf_counter() - started) / max(len(texts), 1)
        return pa.table(
            {
                "id": pa.array(batch["id"].tolist(), pa.string()),
                "shard": pa.array(batch["shard"], pa.int32()),
                "detector": pa.array([self.config.name] * len(texts), pa.string()),
                "toxic_score": pa.array(score, pa.float64()),
                "pred_toxic": pa.array(toxic, pa.bool_()),
                "probs": pa.array([None if p is None else np.asarray(p, np.float32) for p in probs],
                                  pa.list_(pa.float32())),
                "seconds": pa.array(np.full(len(texts), per_row), pa.float64()),
                "det_status": pa.array(status.tolist(), pa.string()),
                "det_reason": pa.array(reason.tolist(), pa.string()),
            },
            schema=DETECTION_BATCH_SCHEMA,
        )

    def score(self, texts: list[str]) -> tuple[list[Any], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = len(texts)
        status = np.full(n, "ok", dtype=object)
        reason = np.full(n, None, dtype=object)
        try:
            probs, score, toxic, errors = self.detector.detect_rows(texts)
        except RedlineError:
            raise  # the user must fix something (unreachable endpoint, bad key): retrying rows cannot
        except Exception as err:  # noqa: BLE001 - isolate the failing rows below
            if self.detector.remote:
                # One failure for the batch, not one request per text against a struggling service.
                cause = f"{type(err).__name__}: {err}"[:300]
                return [None] * n, np.full(n, np.nan), np.zeros(n, dtype=bool), np.full(n, "error", dtype=object), \
                    np.full(n, cause, dtype=object)
            log.warning("detector %s failed on a batch of %d (%s); retrying row by row", self.config.name, n, err)
        else:
            rows: list[Any] = list(probs)
            for i, e in enumerate(errors):
                if e is not None:
                    status[i], reason[i], rows[i] = "error", str(e)[:300], None
            return rows, score, toxic, status, reason
        probs_rows: list[Any] = [None] * n
        score = np.full(n, np.nan)
        toxic = np.zeros(n, dtype=bool)
        for i, text in enumerate(texts):
            try:
                p, s, t = self.detector.detect([text])
                probs_rows[i], score[i], toxic[i] = p[0], s[0], t[0]
            except Exception as err:  # noqa: BLE001
                status[i], reason[i] = "error", f"{type(err).__name__}: {err}"[:300]
        return probs_rows, score, toxic, status, reason
