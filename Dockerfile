# The redline image: redline from this checkout on the pinned Ray's image, with its offline data
# (WordNet 3.0, the spaCy model and all-MiniLM-L6-v2), run as the image's non-root user `ray`.
#
#   docker build -t REGISTRY/redline:0.1.0-gpu .                                     # GPU (default)
#   docker build -t REGISTRY/redline:0.1.0-cpu --build-arg BASE=rayproject/ray:2.60.0-py311-cpu .
#
# The base's own torch is kept when it has one (a CUDA build on GPU images): pyproject.toml declares
# the range redline works with (torch>=2.11,<3), and TORCH_SPEC installs one only when the base has
# none. `.ci/image` builds this same file with buildah on a Debian base made by debootstrap, then
# runs `redline --version`, a small `run score` and `redline serve` inside it, and prints its size.
ARG BASE=rayproject/ray:2.60.0-py311-gpu
FROM ${BASE}

# pip's settings for a build behind a proxy or with a local wheel folder (empty by default)
ARG PIP_CERT=""
ARG PIP_FIND_LINKS=""
ARG TORCH_SPEC="torch>=2.11,<3"

USER root
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wordnet-base wordnet-sense-index \
    && rm -rf /var/lib/apt/lists/*

USER 1000
ENV REDLINE_PROGRESS=lines \
    HF_HUB_DISABLE_TELEMETRY=1
# The dependencies first, at the versions CI tests (requirements.lock, written by .ci/lock.py from
# pyproject.toml): a change to redline's code rebuilds only the layers below, never torch or Ray.
COPY --chown=1000:100 requirements.lock /opt/redline/requirements.lock
RUN python -c "import torch" 2>/dev/null || python -m pip install --no-cache-dir "${TORCH_SPEC}"; \
    python -m pip install --no-cache-dir -r /opt/redline/requirements.lock
# The code (.dockerignore keeps tests/, bench/ and .ci/ out), without touching the dependencies.
COPY --chown=1000:100 . /opt/redline/src
RUN python -m pip install --no-cache-dir --no-deps /opt/redline/src \
    && python -c "import torch; from redline.actors.attack import resources as r; r.pos_tagger(); \
assert r.wordnet_available(), 'no WordNet'; print('torch', torch.__version__, 'encoder', r.default_sentence_encoder())" \
    && redline --version
# Healthy when redline imports and answers; with REDLINE_HEALTH_URL (e.g. http://127.0.0.1:8000/healthz
# in a container running `redline serve`), when that endpoint answers too.
HEALTHCHECK --interval=30s --timeout=15s --start-period=120s --retries=3 \
    CMD redline --version >/dev/null && { [ -z "${REDLINE_HEALTH_URL:-}" ] || python -c "import os, urllib.request; urllib.request.urlopen(os.environ['REDLINE_HEALTH_URL'], timeout=10)"; }
WORKDIR /home/ray
