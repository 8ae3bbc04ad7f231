"""alt-profanity-check's fitted model as plain arrays, so a worker scores without importing sklearn.

The package is a TF-IDF vectorizer and five sigmoid-calibrated linear SVMs (sklearn objects in
joblib pickles). Importing sklearn and unpickling them costs 1.5-2 s of CPU in every actor that
hosts the detector, most of a small run's start-up. The first process to need the model reads it
with sklearn once and keeps its numbers in the user's cache as an `.npz` (loaded with
`allow_pickle=False`: a planted file can be wrong, never code), named by a hash of the package's
two model files so an upgraded package never meets old numbers. Every later actor loads that in
milliseconds and computes the same operations in the same order as sklearn (counts, times idf,
l2-normalised, a dot product per SVM, the sigmoid, the mean), so scores are the package's own, bit for
bit (tests compare them on Davidson's 24,783 tweets).
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from redline.errors import RedlineError

FORMAT = 1
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
# What the arrays reproduce; a package whose vectorizer differs is scored by sklearn itself.
VECTORIZER = {"token_pattern": TOKEN_PATTERN, "lowercase": True, "ngram_range": (1, 1), "analyzer": "word",
              "strip_accents": None, "binary": False, "sublinear_tf": False, "norm": "l2", "use_idf": True,
              "preprocessor": None, "tokenizer": None}


@dataclass(frozen=True)
class ProfanityArrays:
    vocabulary: dict[str, int]
    idf: np.ndarray  # (V,)
    coef: np.ndarray  # (K, V): one row per calibrated SVM
    intercept: np.ndarray  # (K,)
    a: np.ndarray  # (K,) sigmoid calibration: p = 1 / (1 + exp(a * decision + b))
    b: np.ndarray  # (K,)

    def predict_proba(self, texts: list[str]) -> np.ndarray:
        """P(offensive) per text, shape (n,)."""
        token = re.compile(TOKEN_PATTERN)
        vocabulary = self.vocabulary
        rows: list[int] = []
        columns: list[int] = []
        counts: list[int] = []
        for i, text in enumerate(texts):
            seen: dict[int, int] = {}
            for word in token.findall(text.lower()):
                j = vocabulary.get(word)
                if j is not None:
                    seen[j] = seen.get(j, 0) + 1
            for j in sorted(seen):  # sklearn sorts each row's columns before any arithmetic
                rows.append(i)
                columns.append(j)
                counts.append(seen[j])
        n = len(texts)
        row = np.asarray(rows, dtype=np.intp)
        col = np.asarray(columns, dtype=np.intp)
        data = np.asarray(counts, dtype=np.float64) * self.idf[col]
        # bincount adds in input order, as sklearn's row loops do
        norm = np.sqrt(np.bincount(row, weights=data * data, minlength=n))
        scale = norm[row]
        data = np.divide(data, scale, out=data, where=scale != 0.0)
        proba = np.zeros(n)
        for k in range(self.coef.shape[0]):
            decision = np.bincount(row, weights=data * self.coef[k, col], minlength=n) + self.intercept[k]
            proba += 1.0 / (1.0 + _libm_exp(self.a[k] * decision + self.b[k]))
        proba /= self.coef.shape[0]
        proba[(1.0 < proba) & (proba <= 1.0 + 1e-5)] = 1.0
        return proba


def _libm_exp(values: np.ndarray) -> np.ndarray:
    # the C library's exp, as sklearn's sigmoid (scipy's expit) calls it: numpy's own differs from
    # it in the last bit on ~1% of texts
    out = []
    for v in values.tolist():
        try:
            out.append(math.exp(v))
        except OverflowError:
            out.append(math.inf)
    return np.array(out, dtype=np.float64)


def _model_files() -> list[Path]:
    # found without importing the package: its __init__ imports sklearn and unpickles the model
    spec = importlib.util.find_spec("profanity_check")
    if spec is None or not spec.submodule_search_locations:
        raise RedlineError("profanity-check needs the alt-profanity-check package: pip install alt-profanity-check")
    data = Path(list(spec.submodule_search_locations)[0]) / "data"
    return [data / "vectorizer.joblib", data / "model.joblib"]


def stamp() -> str:
    digest = hashlib.sha256(f"format {FORMAT}".encode())
    for path in _model_files():
        digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def from_sklearn() -> ProfanityArrays | None:
    """The package's model as arrays, or None when its vectorizer is one these arrays do not reproduce."""
    from profanity_check import profanity_check as pc

    vectorizer, model = pc.vectorizer, pc.model
    if any(getattr(vectorizer, key, None) != value for key, value in VECTORIZER.items()):
        return None
    if list(model.classes_) != [0, 1] or model.method != "sigmoid":
        return None
    stop_words = vectorizer.get_stop_words() or frozenset()
    vocabulary = {str(word): int(j) for word, j in vectorizer.vocabulary_.items()}
    if stop_words & vocabulary.keys():  # dropping stop words is then the same as ignoring unknown words
        return None
    svms = [c.estimator for c in model.calibrated_classifiers_]
    calibrators = [c.calibrators[0] for c in model.calibrated_classifiers_]
    if any(len(c.calibrators) != 1 or s.coef_.shape != (1, len(vocabulary)) for c, s in
           zip(model.calibrated_classifiers_, svms)):
        return None
    return ProfanityArrays(vocabulary=vocabulary, idf=np.asarray(vectorizer.idf_, dtype=np.float64),
                           coef=np.vstack([s.coef_[0] for s in svms]).astype(np.float64),
                           intercept=np.array([float(s.intercept_[0]) for s in svms]),
                           a=np.array([float(c.a_) for c in calibrators]),
                           b=np.array([float(c.b_) for c in calibrators]))


def save(arrays: ProfanityArrays, path: Path) -> None:
    words = sorted(arrays.vocabulary, key=arrays.vocabulary.__getitem__)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, words=np.array(words, dtype=str), idf=arrays.idf, coef=arrays.coef,
                 intercept=arrays.intercept, a=arrays.a, b=arrays.b)
    os.replace(tmp, path)


def load(path: Path) -> ProfanityArrays | None:
    """The arrays saved at `path`, or None when the file is missing or not a whole, consistent set."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f, np.load(f, allow_pickle=False) as saved:
            words = [str(w) for w in saved["words"]]
            arrays = ProfanityArrays(vocabulary={w: j for j, w in enumerate(words)},
                                     idf=saved["idf"].astype(np.float64), coef=saved["coef"].astype(np.float64),
                                     intercept=saved["intercept"], a=saved["a"], b=saved["b"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    k, v = arrays.coef.shape if arrays.coef.ndim == 2 else (0, 0)
    if not (k and v == len(arrays.vocabulary) == arrays.idf.shape[0] == len(words)
            and arrays.intercept.shape == arrays.a.shape == arrays.b.shape == (k,)):
        return None
    return arrays


def cached() -> ProfanityArrays | None:
    """The package's model as arrays from this user's cache, made there on first use; None when the
    arrays cannot reproduce it (the caller then uses sklearn)."""
    from redline.cluster.storage import private_dir, user_cache_dir

    name = f"profanity-check-{stamp()}.npz"
    try:
        user_cache_dir().parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder = private_dir(user_cache_dir(), "cache")
    except (OSError, RedlineError):
        folder = None
    if folder is not None and (arrays := load(folder / name)) is not None:
        return arrays
    arrays = from_sklearn()
    if arrays is not None and folder is not None:
        try:
            save(arrays, folder / name)
        except OSError:
            pass  # a read-only cache only costs the next actor the sklearn import again
    return arrays
