# The ackline image: `docker build -t ackline .`; the entrypoint is the `ackline` CLI.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY ackline ./ackline
COPY schemas ./schemas
COPY streams ./streams
COPY sinks ./sinks
COPY load ./load
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home ackline \
    && mkdir /app/.ackline && chown ackline /app/.ackline

USER ackline
ENTRYPOINT ["ackline"]
CMD ["run"]
