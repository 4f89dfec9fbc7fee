# litlab in a container: CUDA runtime, Python, litlab with its extras; `litlab-train` is the entry point.
#   docker build -t litlab .
#   docker run --rm --gpus all -v "$PWD/logs:/home/litlab/app/logs" litlab trainer=gpu
# Arguments after the image name are litlab-train overrides. Checkpoints persist wherever
# storage.root points (a mounted volume, s3://...); see docs/cloud.md.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# Python from the distribution. The base image is pinned by tag; its apt packages follow that
# release's updates (not pinned).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# A non-root user, numeric so that runtimes (e.g. Kubernetes runAsNonRoot) can check it.
RUN groupadd --gid 1000 litlab \
    && useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash litlab \
    && install -d -o 1000 -g 1000 /home/litlab/app \
    && python3 -m venv /opt/venv \
    && chown -R 1000:1000 /opt/venv

USER 1000:1000
WORKDIR /home/litlab/app

# A plain (non-editable) install: the wheel carries the engine's config groups and configs/
# (through the link src/litlab_configs), so litlab-train works from any directory.
COPY --chown=1000:1000 pyproject.toml README.md ./
COPY --chown=1000:1000 src ./src
COPY --chown=1000:1000 configs ./configs
RUN pip install './[s3,gcs,azure,sweeps]' \
    && mkdir -p logs

ENTRYPOINT ["litlab-train"]
CMD []
