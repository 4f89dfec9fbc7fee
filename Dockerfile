# litlab in a container: CUDA runtime, Python, litlab with its extras, run as a non-root user.
#   make image                        (docker build -t litlab . where a Docker daemon runs, else podman)
#   docker run --rm --gpus all -v "$PWD/logs:/home/litlab/app/logs" litlab trainer=gpu
#   docker run --rm -v "$PWD/logs:/home/litlab/app/logs" litlab litlab-eval ckpt_path=logs/...
# Arguments after the image name are litlab-train overrides, or a litlab command (litlab-eval,
# litlab-predict, litlab-compare) and its arguments. Checkpoints persist wherever storage.root points
# (a mounted volume, s3://...); see docs/cloud.md. RUN --mount needs BuildKit (Docker 23+) or podman.
# Fully qualified: podman resolves no short names where no search registries are configured.
FROM docker.io/nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

# MPLCONFIGDIR: matplotlib needs a writable folder for its font cache; /tmp keeps it out of the
# image's layers and works with a read-only root filesystem (docker run --read-only --tmpfs /tmp).
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    MPLCONFIGDIR=/tmp/matplotlib

# Python from the distribution; CA certificates for the object stores' HTTPS clients that read the
# system's (aiohttp: gcsfs, adlfs). The base image is pinned by tag; its apt packages follow that
# release's updates (not pinned).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# A non-root user, numeric so that runtimes (e.g. Kubernetes runAsNonRoot) can check it.
RUN groupadd --gid 1000 litlab \
    && useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash litlab \
    && install -d -o 1000 -g 1000 /home/litlab/app /home/litlab/.cache \
    && python3 -m venv /opt/venv \
    && chown -R 1000:1000 /opt/venv

USER 1000:1000
WORKDIR /home/litlab/app

# Build-time only, never in the image's environment: a pip configuration for this build's pip, e.g.
# podman build -v WHEELS:/mnt:ro --build-arg PIP_CONFIG_FILE=/mnt/pip.conf (tests/container_image.py).
ARG PIP_CONFIG_FILE

# The dependencies first, from pyproject.toml alone (an empty src/: a litlab with no code), in a
# layer of their own: an edit to src/ or configs/ then reinstalls litlab only. pip's cache is a
# build cache mount: a rebuild takes torch from it instead of downloading it again, and no layer
# holds it.
COPY --chown=1000:1000 pyproject.toml README.md ./
RUN --mount=type=cache,target=/home/litlab/.cache/pip,uid=1000,gid=1000 \
    mkdir src \
    && pip install './[s3,gcs,azure,sweeps]'

# A plain (non-editable) install: the wheel carries the engine's config groups and configs/
# (through the link src/litlab_configs), so litlab-train works from any directory.
COPY --chown=1000:1000 src ./src
COPY --chown=1000:1000 configs ./configs
RUN --mount=type=cache,target=/home/litlab/.cache/pip,uid=1000,gid=1000 \
    pip install --no-deps --force-reinstall . \
    && rm -rf build src/*.egg-info \
    && mkdir -p logs

# exec: the command is PID 1 and receives the runtime's signals (SIGTERM writes preempted.ckpt).
ENTRYPOINT ["/bin/sh", "-c", "case \"$1\" in litlab-*) exec \"$@\" ;; esac; exec litlab-train \"$@\"", "litlab"]
CMD []
