# The ackline image: `docker build -t ackline .`; the entrypoint is the `ackline` CLI.
# Every dependency is pinned by constraints.txt (the file `make install` uses too), so the
# image runs the versions the tests ran. `--build-arg EXTRAS=[faust]` adds the faust runtime.
FROM python:3.11.13-slim-bookworm

ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY ackline ./ackline
COPY schemas ./schemas
COPY streams ./streams
COPY sinks ./sinks
COPY load ./load
RUN pip install --constraint constraints.txt ".${EXTRAS}" \
    && useradd --system --uid 10001 --no-create-home ackline \
    && mkdir /app/.ackline && chown ackline /app/.ackline

USER ackline
# /metrics, /healthz and /readyz (ACKLINE_METRICS_PORT; bind ACKLINE_METRICS_HOST=0.0.0.0
# for a scraper outside the container)
EXPOSE 9400
ENTRYPOINT ["ackline"]
CMD ["run"]
