# One image for every Kenning process; the command picks the service:
#   docker run IMAGE worker | ingress | scheduler | relayer | migrate | sink
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY shared shared
COPY services services
COPY devtools devtools
# the broker clients too (compose's brokers profile: amqp:// and nats:// sources and
# targets); --build-arg KENNING_EXTRAS=amqp,nats,otel adds tracing, say
ARG KENNING_EXTRAS=amqp,nats
# the locked set: the versions CI tested, not whatever PyPI serves today
RUN pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt ".[${KENNING_EXTRAS}]"

FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 KENNING_LOG_FORMAT=json
RUN useradd --create-home --uid 10001 kenning
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
WORKDIR /app
# The example application; mount or COPY your own modules and set KENNING_APP.
COPY examples examples
USER kenning
ENTRYPOINT ["kenning"]
CMD ["worker"]
